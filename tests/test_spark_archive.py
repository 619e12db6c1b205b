"""The archive job: consumed messages to Parquet, idempotently, and GC waits for it."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from django_sqlqueue import publish
from django_sqlqueue.models import ArchiveMark, ConsumerOffset, QueueMessage
from django_sqlqueue.sequencing import partition_counts, sequence_all
from django_sqlqueue.spark import archive as archive_module
from django_sqlqueue.spark.archive import archive, main
from django_sqlqueue.store import archive as archive_store
from django_sqlqueue.store.connection import open_connection
from django_sqlqueue.worker.collector import collect_garbage
from tests.settings import SQLQUEUE
from tests.spark_support import database_url
from tests.worker_harness import REPO_ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


@pytest.fixture(autouse=True)
def orders_topic():
    partition_counts(["orders"], "default")


def consume_all_but(keys_left: set[str]) -> None:
    """Group "billing" acks every partition except those holding ``keys_left``."""
    kept = set(QueueMessage.objects.filter(topic="orders", message_key__in=keys_left)
               .values_list("partition_key", flat=True))
    for partition in range(12):
        heads = QueueMessage.objects.filter(topic="orders", partition_key=str(partition))
        top = max(heads.values_list("position", flat=True), default=0)
        ConsumerOffset.objects.update_or_create(
            consumer_group="billing", topic="orders", partition_key=str(partition),
            defaults={"offset_acked": 0 if str(partition) in kept else top})


def archived_ids(spark, out) -> list[str]:
    return sorted(r["id"] for r in spark.read.parquet(str(out)).collect())


def test_archive_then_gc_loses_nothing(spark, tmp_path):
    for i in range(40):
        publish("orders", {"n": i}, key=f"k{i % 8}", id=f"m{i}")
    sequence_all()
    consume_all_but({"k0"})
    everything = set(QueueMessage.objects.values_list("message_id", flat=True))
    with override_settings(SQLQUEUE={**SQLQUEUE, "ARCHIVE_BEFORE_GC": True}):
        assert collect_garbage(["orders"], {}, "default") == 0  # nothing archived yet
        [summary] = archive(spark, database_url(), str(tmp_path / "archive"), ["orders"])
        in_archive = archived_ids(spark, tmp_path / "archive")
        assert summary.messages == len(in_archive) > 0
        assert collect_garbage(["orders"], {}, "default") == len(in_archive)
    left = set(QueueMessage.objects.values_list("message_id", flat=True))
    assert left | set(in_archive) == everything and not left & set(in_archive)
    # A rerun exports nothing twice; what is consumed later is exported then.
    consume_all_but(set())
    archive(spark, database_url(), str(tmp_path / "archive"), ["orders"])
    assert archived_ids(spark, tmp_path / "archive") == sorted(everything)


def test_archive_is_partitioned_by_topic_and_date(spark, tmp_path):
    publish("orders", {"n": 1}, key="k", id="one")
    sequence_all()
    consume_all_but(set())
    archive(spark, database_url(), str(tmp_path / "a"))
    [path] = list((tmp_path / "a").glob("topic=orders/date=*/*.parquet"))
    assert ArchiveMark.objects.filter(topic="orders").exclude(archived_position=0).count() == 1
    assert path.name.endswith(".parquet")


def test_a_run_stopped_while_moving_files_is_undone_by_the_next(spark, tmp_path):
    out = tmp_path / "a"
    stray = out / "topic=orders" / "date=2026-01-01" / "deadbeef0000-part-0.parquet"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"half")
    with open_connection(database_url()) as conn, conn.atomic():
        archive_store.set_pending(conn, "orders", {"0": 5}, "deadbeef0000")
    archive(spark, database_url(), str(out), ["orders"])
    assert not stray.exists()
    assert not ArchiveMark.objects.exclude(pending_run="").exists()


def test_the_command_prints_a_summary_per_topic(spark, tmp_path, capsys):
    publish("orders", {"n": 1}, key="k", id="x")
    sequence_all()
    consume_all_but(set())
    assert main(["--url", database_url(), "--out", str(tmp_path / "a"), "--topics", "orders"]) == 0
    out = capsys.readouterr().out
    assert "orders: 1 messages" in out and "dead letters by group: none" in out


def test_a_range_gc_deleted_already_moves_the_marks_and_archives_nothing(spark, tmp_path):
    publish("orders", {"n": 1}, key="k", id="gone")
    sequence_all()
    consume_all_but(set())
    assert collect_garbage(["orders"], {}, "default") == 1  # GC does not wait by default

    [summary] = archive(spark, database_url(), str(tmp_path / "a"), ["orders"])

    assert summary.messages == 0
    assert not list((tmp_path / "a").glob("topic=*/date=*/*.parquet"))
    assert ArchiveMark.objects.filter(topic="orders").exclude(archived_position=0).count() == 1


# docs/spark.md runs the job as spark-submit's file argument: by path, not as a module.
JOB = Path(archive_module.__file__)


def test_the_job_starts_when_run_by_path_or_as_a_module(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for command in ([sys.executable, str(JOB), "--help"],
                    [sys.executable, "-m", "django_sqlqueue.spark.archive", "--help"]):
        # From another directory, as spark-submit runs it: only the package is importable.
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        assert "--out OUT" in result.stdout


def test_the_job_run_by_path_archives(spark, tmp_path, capsys, monkeypatch):
    publish("orders", {"n": 1}, key="k", id="x")
    sequence_all()
    consume_all_but(set())
    monkeypatch.setattr(sys, "argv", [str(JOB), "--url", database_url(), "--out",
                                      str(tmp_path / "a"), "--topics", "orders"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the job drops its own directory

    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(JOB), run_name="__main__")  # what python path/to/archive.py does

    assert done.value.code == 0
    assert "orders: 1 messages" in capsys.readouterr().out
    assert archived_ids(spark, tmp_path / "a") == ["x"]
