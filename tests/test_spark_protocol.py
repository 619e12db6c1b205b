"""The Spark data source driven the way Spark drives it, without a JVM.

Spark's Python Data Source API calls plain methods of our reader, stream reader and
writer objects (``partitions``, ``read``, ``initialOffset``, ``latestOffset``, ``commit``,
``write``) and passes Arrow batches. This module calls the same methods in this process,
so the data source's SQL and its bookkeeping run on every backend in seconds. The suites
that start a real Spark session (``tests/test_spark_*.py``, marked ``spark``) cover the
same paths end to end; ``make test`` runs those on one backend and this module on all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from django.db import connection

from django_sqlqueue import InvalidMessage, publish
from django_sqlqueue import operations as ops
from django_sqlqueue.models import ConsumerOffset, QueueMessage
from django_sqlqueue.replays import GROUP_HEADER
from django_sqlqueue.sequencing import partition_counts, sequence_all
from django_sqlqueue.worker.collector import collect_garbage
from tests.factories import QueueMessageFactory
from tests.spark_support import database_url, require_spark

require_spark()

import pyarrow as pa  # noqa: E402 - only once the spark extra is known to be there
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402
from pyspark.sql.types import MapType, StringType, StructField, StructType  # noqa: E402

from django_sqlqueue.spark.source import SqlQueueDataSource  # noqa: E402
from django_sqlqueue.spark.streaming import DataLoss, SqlQueueStreamReader  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "orders"


@pytest.fixture(autouse=True)
def orders_topic():
    partition_counts([TOPIC], "default")


def source(**options: str) -> SqlQueueDataSource:
    return SqlQueueDataSource({"url": database_url(), **options})


def rows_of(batches: Iterator[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [row for batch in batches for row in batch.to_pylist()]


def batch_read(**options: str) -> list[dict[str, Any]]:
    """What ``spark.read.format("sqlqueue")`` returns, partition by partition."""
    ds = source(**options)
    reader = ds.reader(StructType())
    return [row for partition in reader.partitions() for row in rows_of(reader.read(partition))]


def write(rows: Sequence[dict[str, Any]], schema: StructType, **options: str) -> tuple[int, int]:
    """One write task over ``rows``, as ``df.write.format("sqlqueue")`` runs it."""
    writer = source(**options).writer(schema, overwrite=False)
    arrow_schema = pa.schema([(f.name, pa.map_(pa.string(), pa.string())
                               if isinstance(f.dataType, MapType) else pa.string())
                              for f in schema.fields])
    batch = pa.RecordBatch.from_pylist(list(rows), schema=arrow_schema)
    written = writer.write(iter([batch]))
    writer.commit([written])
    return written.rows, written.inserted


class Stream:
    """A streaming query's driver and executors in one object: Spark's call order."""

    def __init__(self, **options: str) -> None:
        self.reader: SqlQueueStreamReader = source(topic=TOPIC, **options).streamReader(StructType())
        self.offset: dict[str, int] | None = None

    def batch(self, max_rows: int | None = None) -> list[dict[str, Any]]:
        if self.offset is None:
            self.offset = self.reader.initialOffset()
        else:
            self.reader.commit(self.offset)  # batch N is committed when N+1 is planned
        limit = ReadMaxRows(max_rows) if max_rows else ReadAllAvailable()
        end = self.reader.latestOffset(self.offset, limit)
        rows = [row for part in self.reader.partitions(self.offset, end)
                for row in rows_of(self.reader.read(part))]
        self.offset = end
        return rows

    def stop(self, commit: bool = True) -> None:
        if commit and self.offset is not None:
            self.reader.commit(self.offset)
        self.reader.stop()


def watermarks(group: str) -> dict[str, int]:
    return dict(ConsumerOffset.objects.filter(consumer_group=group, topic=TOPIC)
                .values_list("partition_key", "offset_acked"))


# --------------------------------------------------------------------------- batch reads


def test_a_batch_read_returns_every_message_once_sequenced_or_not():
    for i in range(7):
        publish(TOPIC, {"n": i}, key=f"k{i % 3}", id=f"a{i}", headers={"trace": str(i)})
    sequence_all()
    publish(TOPIC, {"n": 7}, key="k0", id="late")  # not positioned yet
    publish("other", {"n": 8}, id="elsewhere")

    rows = batch_read(topic=TOPIC, numPartitions="3", pageSize="2")

    assert sorted(r["id"] for r in rows) == sorted([f"a{i}" for i in range(7)] + ["late"])
    by_id = {r["id"]: r for r in rows}
    assert by_id["late"]["position"] is None and by_id["a3"]["position"] is not None
    stored = QueueMessage.objects.get(message_id="a4")
    assert (by_id["a4"]["key"], by_id["a4"]["offset"], json.loads(by_id["a4"]["payload"]),
            json.loads(by_id["a4"]["headers"])) == ("k1", stored.offset, {"n": 4}, {"trace": "4"})


def test_a_batch_read_of_positions_and_of_the_state_tables():
    for i in range(5):
        publish(TOPIC, {"n": i}, key="k", id=f"p{i}")
    sequence_all()
    positions = sorted(QueueMessage.objects.filter(topic=TOPIC).values_list("position", flat=True))

    window = batch_read(topic=TOPIC, startPosition=str(positions[0]), endPosition=str(positions[3]))

    assert sorted(r["position"] for r in window) == positions[1:4]
    ConsumerOffset.objects.create(consumer_group="billing", topic=TOPIC, partition_key="0",
                                  offset_acked=positions[1])
    offsets = batch_read(table="offsets", topic=TOPIC)
    assert [(r["consumer_group"], r["partition"], r["offset_acked"]) for r in offsets] == \
        [("billing", 0, positions[1])]


# --------------------------------------------------------------------------- writes

SCHEMA = StructType([StructField("payload", StringType()), StructField("key", StringType()),
                     StructField("id", StringType()),
                     StructField("headers", MapType(StringType(), StringType()))])


def test_written_rows_are_published_once_however_often_the_task_runs():
    rows = [{"payload": f'{{"n": {i}}}', "key": f"k{i % 2}", "id": f"w{i}",
             "headers": {"source": "spark"}} for i in range(5)]

    assert write(rows, SCHEMA, topic=TOPIC) == (5, 5)
    assert write(rows, SCHEMA, topic=TOPIC) == (5, 0)  # a retried task or a rerun

    stored = {m.message_id: m for m in QueueMessage.objects.filter(topic=TOPIC)}
    assert sorted(stored) == [f"w{i}" for i in range(5)]
    assert (stored["w3"].message_key, stored["w3"].payload, stored["w3"].metadata) == \
        ("k1", {"n": 3}, {"source": "spark"})
    assert stored["w3"].partition_key == ""  # positioned later, like publish()'s rows
    published = publish(TOPIC, {"n": 3}, key="k1", id="by-publish", headers={"source": "spark"})
    row = QueueMessage.objects.get(offset=published.offset)
    assert (row.payload, row.metadata) == (stored["w3"].payload, stored["w3"].metadata)


def test_the_writer_refuses_a_reserved_header_and_a_bad_row_naming_them():
    with pytest.raises(InvalidMessage, match=f"header '{GROUP_HEADER}' is reserved"):
        write([{"payload": "1", "key": "k", "id": "r1", "headers": {GROUP_HEADER: "billing"}}],
              SCHEMA, topic=TOPIC)
    with pytest.raises(InvalidMessage, match="row with id 'r2'.*payload is not valid JSON"):
        write([{"payload": "{not json", "key": "k", "id": "r2", "headers": None}], SCHEMA,
              topic=TOPIC)

    assert not QueueMessage.objects.filter(topic=TOPIC).exists()


def test_rows_may_name_their_topic_and_a_new_topic_gets_the_partitions_option():
    schema = StructType([StructField("payload", StringType()), StructField("id", StringType()),
                         StructField("topic", StringType())])
    rows = [{"payload": "1", "id": "t1", "topic": "fresh"}, {"payload": "2", "id": "t2", "topic": TOPIC}]

    assert write(rows, schema, topicColumn="topic", partitions="3") == (2, 2)

    assert partition_counts(["fresh"], "default") == {"fresh": 3}
    assert sorted(QueueMessage.objects.values_list("topic", "message_id")) == \
        [("fresh", "t1"), (TOPIC, "t2")]


# --------------------------------------------------------------------------- streams


def test_a_stream_reads_in_position_order_in_batches_of_at_most_max_rows():
    for i in range(7):
        publish(TOPIC, {"n": i}, key=f"k{i % 3}", id=f"s{i}")
    stream = Stream(numPartitions="2")

    batches = [stream.batch(max_rows=3) for _ in range(4)]

    assert [len(b) for b in batches] == [3, 3, 1, 0]
    positions = [r["position"] for b in batches for r in b]
    assert positions == sorted(positions) and len(set(positions)) == 7
    assert sorted(r["id"] for b in batches for r in b) == [f"s{i}" for i in range(7)]
    stream.stop()


def test_a_grouped_stream_commits_watermarks_and_a_fresh_one_resumes_from_them():
    for i in range(6):
        publish(TOPIC, {"n": i}, key=f"k{i}", id=f"g{i}")
    first = Stream(group="lake")
    assert len(first.batch()) == 6
    first.stop()
    assert ops.overview(topic=TOPIC)[0].lag == 0
    last = {m.partition_key: m.position for m in QueueMessage.objects.filter(topic=TOPIC)}
    assert {p: mark for p, mark in watermarks("lake").items() if p in last} == last

    for i in range(3):
        publish(TOPIC, {"n": i}, key=f"k{i}", id=f"h{i}")
    again = Stream(group="lake")  # no checkpoint: the group's progress decides
    assert sorted(r["id"] for r in again.batch()) == ["h0", "h1", "h2"]
    again.stop()


def test_a_new_group_at_latest_starts_at_the_head():
    publish(TOPIC, {"n": 0}, key="k", id="before")
    stream = Stream(group="fresh", startingPosition="latest")
    assert stream.batch() == []
    publish(TOPIC, {"n": 1}, key="k", id="after")
    assert [r["id"] for r in stream.batch()] == ["after"]
    stream.stop()


def test_a_grouped_stream_passes_over_a_replay_meant_for_another_group():
    publish(TOPIC, {"n": 1}, key="k", id="plain")
    # Replays, as the replay operation writes them (a publisher cannot set these headers).
    QueueMessageFactory(topic=TOPIC, message_key="k", message_id="replay:7", payload={"n": 2},
                        metadata={GROUP_HEADER: "billing"})
    QueueMessageFactory(topic=TOPIC, message_key="k", message_id="mine", payload={"n": 3},
                        metadata={GROUP_HEADER: "lake"})

    grouped, everything = Stream(group="lake"), Stream()

    assert sorted(r["id"] for r in grouped.batch()) == ["mine", "plain"]
    assert sorted(r["id"] for r in everything.batch()) == ["mine", "plain", "replay:7"]
    grouped.stop()
    everything.stop()


def test_a_stream_without_a_group_fails_when_gc_collected_what_it_had_not_read():
    for i in range(2):
        publish(TOPIC, {"n": i}, key="k", id=f"d{i}")
    stream = Stream()
    assert len(stream.batch()) == 2
    for i in range(2, 5):
        publish(TOPIC, {"n": i}, key="k", id=f"d{i}")
    sequence_all()
    # A worker group acks everything and GC collects it before the stream reads on.
    message = QueueMessage.objects.filter(topic=TOPIC).order_by("-position").first()
    ConsumerOffset.objects.create(consumer_group="billing", topic=TOPIC,
                                  partition_key=message.partition_key, offset_acked=message.position)
    assert collect_garbage([TOPIC], {}, "default") == 5

    with pytest.raises(DataLoss, match="deleted by GC before this stream read them"):
        stream.batch()
    stream.stop(commit=False)
    tolerant = Stream(failOnDataLoss="false")
    tolerant.offset = {"position": 2}
    assert tolerant.batch() == []
    tolerant.stop()


def test_a_message_whose_transaction_commits_late_is_read_in_a_later_batch():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has a single writer: a publishing transaction blocks every other "
                    "publisher, so a commit cannot come late")
    from django_sqlqueue.encoding import build_row
    from django_sqlqueue.store import messages as message_store
    from django_sqlqueue.store.connection import open_connection

    held = open_connection(database_url())
    try:
        held.begin()
        message_store.insert_rows(held, [build_row(TOPIC, {"late": True}, "k", "late", None, None,
                                                   1 << 20)])
        publish(TOPIC, {"n": 1}, key="k", id="early")
        stream = Stream()
        assert [r["id"] for r in stream.batch()] == ["early"]
        held.commit()
    finally:
        held.close()
    assert [r["id"] for r in stream.batch()] == ["late"]
    stream.stop()


# --------------------------------------------------------------------------- the archive job


def test_the_archive_jobs_ranges_and_its_progress_marks(tmp_path):
    from django_sqlqueue.spark import archive as job
    from django_sqlqueue.store import archive as archive_store
    from django_sqlqueue.store.connection import open_connection

    for i in range(4):
        publish(TOPIC, {"n": i}, key="k", id=f"x{i}")
    sequence_all()
    message = QueueMessage.objects.filter(topic=TOPIC).order_by("-position").first()
    ConsumerOffset.objects.create(consumer_group="billing", topic=TOPIC,
                                  partition_key=message.partition_key, offset_acked=message.position)
    partition = int(message.partition_key)

    with open_connection(database_url()) as conn:
        assert job._ranges(conn, [TOPIC]) == [(TOPIC, partition, 0, message.position)]
        with conn.atomic():
            archive_store.set_pending(conn, TOPIC, {str(partition): message.position}, "run1")
        assert archive_store.pending_runs(conn) == ["run1"]
        # A run that stopped while moving its files: the next one removes them and the marks
        # stay where they were.
        (tmp_path / f"topic={TOPIC}" / "date=2026-11-26").mkdir(parents=True)
        stale = tmp_path / f"topic={TOPIC}" / "date=2026-11-26" / "run1-part-0.parquet"
        stale.touch()
        job._recover(conn, tmp_path)
        assert not stale.exists() and archive_store.pending_runs(conn) == []
        assert job._ranges(conn, [TOPIC]) == [(TOPIC, partition, 0, message.position)]

        with conn.atomic():
            archive_store.set_pending(conn, TOPIC, {str(partition): message.position}, "run2")
            archive_store.finish(conn, "run2")
        assert archive_store.marks(conn, TOPIC) == {str(partition): message.position}
        assert job._ranges(conn, [TOPIC]) == []
