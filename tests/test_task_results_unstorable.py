"""A task's return value or error that the database cannot store as it is (a NUL
character, which PostgreSQL refuses; a value over SQLQUEUE["MAX_PAYLOAD_BYTES"]) is
recorded in a storable form saying what was dropped: the task runs once, and a task that
succeeded stays SUCCESSFUL (real worker processes)."""

from __future__ import annotations

import pytest

from django_sqlqueue.conf import get_settings
from django_sqlqueue.limits import ERROR_LENGTH, storable_error
from django_sqlqueue.models import QueueMessage
from django_sqlqueue.tasks.compat import TaskResultStatus
from django_sqlqueue.tasks.storable import MARKER
from tests.testapp import tasks
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

NUL_TEXT = [0, 0xFF, ord("A")]  # "\x00ÿA"


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def finished(result, worker):  # type: ignore[no-untyped-def]
    def done():  # type: ignore[no-untyped-def]
        fresh = tasks.add.get_backend().get_result(result.id)
        return fresh if fresh.is_finished else None

    return wait_until(done, timeout=40, what=f"task {result.id} finishing", watch=[worker])


def runs(label: str) -> int:
    return Handled.objects.filter(group="tasks", key=label).count()


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_unstorable_outcomes_are_recorded_in_a_storable_form_and_each_task_runs_once(workers):
    limit = get_settings().max_payload_bytes
    nul_return = tasks.returns_text.enqueue("nul-return", NUL_TEXT)
    big_return = tasks.returns_text.enqueue("big-return", [ord("x")], limit + 10)
    nul_error = tasks.fails_with_text.enqueue("nul-error", NUL_TEXT)
    big_error = tasks.fails_with_text.enqueue("big-error", [ord("y")], 5 * ERROR_LENGTH)
    worker = workers.start("unstorable", "--queue", "default")

    # NULs are written out as escapes, and a marker says so.
    result = finished(nul_return, worker)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["value"] == "\\x00\xffA"
    assert "NUL" in result.return_value[MARKER]

    # Too big: a marker saying its type and size.
    result = finished(big_return, worker)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["type"] == "str"
    assert result.return_value["bytes"] == limit + 12  # the quotes of the JSON string
    assert "MAX_PAYLOAD_BYTES" in result.return_value[MARKER]

    # An error keeps its exception, NULs escaped.
    result = finished(nul_error, worker)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert result.errors[0].traceback.rstrip().endswith("ValueError: \\x00\xffA")

    # A long error keeps its start and its end, with what was dropped between.
    result = finished(big_error, worker)
    assert result.status == TaskResultStatus.FAILED
    traceback = result.errors[0].traceback
    assert len(traceback) <= ERROR_LENGTH
    assert traceback.startswith("Traceback") and traceback.rstrip().endswith("y" * 100)
    assert "characters dropped" in traceback

    for label in ("nul-return", "big-return", "nul-error", "big-error"):
        assert runs(label) == 1, label
    # The two failures, and nothing else, in the dead letters.
    dead = set(QueueMessage.objects.filter(topic="tasks.default_dlq")
               .values_list("original_id", flat=True))
    assert dead == {nul_error.id, big_error.id}


def test_storable_error_keeps_the_end_of_a_long_text_when_asked():
    text = "start " + "x" * 50_000 + " the end"
    kept = storable_error(text, 1000, keep_end=True)
    assert len(kept) <= 1000
    assert kept.startswith("start ") and kept.endswith(" the end")
    dropped = len(text) - len(kept.split("\n")[0]) - len(kept.split("\n")[2])
    assert f"[... {dropped:,} characters dropped ...]" in kept
    assert storable_error("a\x00b") == "a\\x00b"


def test_results_set_successful_together_stay_under_a_statement_size():
    from django_sqlqueue.models.task_results import SUCCESS_BATCH_BYTES, Success, _batches

    big = [Success(str(i), None, None, "x", SUCCESS_BATCH_BYTES // 3) for i in range(7)]
    sizes = [sum(s.size for s in batch) for batch in _batches(big)]
    assert sum(len(b) for b in _batches(big)) == 7
    assert all(size <= SUCCESS_BATCH_BYTES for size in sizes)
    assert [len(b) for b in _batches([Success(str(i), None, None) for i in range(1200)])] == [
        500, 500, 200]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_return_value_over_mariadb_s_max_allowed_packet_is_recorded_as_a_marker(workers):
    """20 MiB: over max_allowed_packet's 16 MiB default, which MariaDB enforces by closing
    the connection (the cycle recording it failed at every try); a marker on every backend."""
    big = tasks.returns_text.enqueue("huge-return", [ord("z")], 20 * 1024 * 1024)
    small = [tasks.add.enqueue(i, 1) for i in range(3)]
    worker = workers.start("huge", "--queue", "default")
    result = finished(big, worker)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert (result.return_value["type"], result.return_value["bytes"]) == ("str", 20 * 1024 * 1024 + 2)
    assert [finished(s, worker).return_value for s in small] == [1, 2, 3]
    assert runs("huge-return") == 1
