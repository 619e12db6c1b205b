"""The sqlqueue data source as a stream: positions as offsets, checkpoints, consumer groups."""

from __future__ import annotations

import pytest
from django.db import connection

from django_sqlqueue import publish
from django_sqlqueue.encoding import build_row
from django_sqlqueue.models import ConsumerOffset, QueueMessage
from django_sqlqueue.partitioning import partition_for, partition_names
from django_sqlqueue.replays import GROUP_HEADER
from django_sqlqueue.sequencing import partition_counts, sequence_all
from django_sqlqueue.store import messages as message_store
from django_sqlqueue.store.connection import open_connection
from django_sqlqueue.worker.collector import collect_garbage
from tests.factories import QueueMessageFactory
from tests.spark_support import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


@pytest.fixture(autouse=True)
def orders_topic():
    partition_counts(["orders"], "default")


def run_stream(spark, tmp_path, name="out", **options):
    """One trigger(availableNow=True) run into Parquet under ``tmp_path``; the ids read
    so far (by every run with the same name) and the run's per-batch row counts."""
    reader = spark.readStream.format("sqlqueue").option("url", database_url()).option("topic", "orders")
    for option, value in options.items():
        reader = reader.option(option, value)
    query = (reader.load().select("id", "position").writeStream.format("parquet")
             .option("path", str(tmp_path / name))
             .option("checkpointLocation", str(tmp_path / f"{name}.ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    ids = [r["id"] for r in spark.read.parquet(str(tmp_path / name)).collect()]
    return ids, batches


def test_stream_resumed_from_its_checkpoint_sees_each_message_once(spark, tmp_path):
    for i in range(10):
        publish("orders", {"n": i}, key=f"k{i % 3}", id=f"a{i}")
    ids, _ = run_stream(spark, tmp_path)
    assert sorted(ids) == sorted(f"a{i}" for i in range(10))
    for i in range(5):
        publish("orders", {"n": i}, key=f"k{i % 3}", id=f"b{i}")
    ids, _ = run_stream(spark, tmp_path)
    assert sorted(ids) == sorted([f"a{i}" for i in range(10)] + [f"b{i}" for i in range(5)])


def test_max_rows_per_batch_holds_under_available_now(spark, tmp_path):
    for i in range(10):
        publish("orders", {"n": i}, id=f"m{i}")
    ids, batches = run_stream(spark, tmp_path, maxRowsPerBatch="3")
    assert batches == [3, 3, 3, 1]
    assert len(ids) == 10


def test_a_message_committed_late_appears_in_the_stream(spark, tmp_path):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has a single writer: an open publishing transaction blocks every "
                    "other publisher, so a commit cannot come late")
    held = open_connection(database_url())
    try:
        held.begin()
        message_store.insert_rows(held, [build_row("orders", {"late": True}, "k", "late", None, None,
                                                   1 << 20)])
        publish("orders", {"n": 1}, key="k", id="early")
        ids, _ = run_stream(spark, tmp_path)
        assert ids == ["early"]
        held.commit()
    finally:
        held.close()
    ids, _ = run_stream(spark, tmp_path)
    assert sorted(ids) == ["early", "late"]


def test_a_grouped_stream_holds_gc_back_and_shows_lag(spark, tmp_path):
    for i in range(6):
        publish("orders", {"n": i}, key="k", id=f"g{i}")
    ids, batches = run_stream(spark, tmp_path, group="analytics", maxRowsPerBatch="2")
    assert batches == [2, 2, 2] and len(ids) == 6
    # Registered from the start, with a watermark per partition of "orders".
    assert ConsumerOffset.objects.filter(consumer_group="analytics", topic="orders").count() == 12
    # Spark committed batches 0 and 1 when it planned the next ones; the last batch is
    # committed by the next run: the group trails by one batch.
    assert ConsumerOffset.objects.unconsumed_counts("orders", ["analytics"], "default") == {"analytics": 2}
    collect_garbage(["orders"], {}, "default")
    assert sorted(QueueMessage.objects.filter(topic="orders").values_list("message_id", flat=True)) \
        == ["g4", "g5"]
    publish("orders", {"n": 6}, key="k", id="g6")
    ids, _ = run_stream(spark, tmp_path, group="analytics", maxRowsPerBatch="2")
    assert sorted(ids) == [f"g{i}" for i in range(7)]  # each message once
    assert ConsumerOffset.objects.unconsumed_counts("orders", ["analytics"], "default") == {"analytics": 1}


def test_a_grouped_stream_started_afresh_resumes_from_the_groups_progress(spark, tmp_path):
    # One key: the other eleven partitions of "orders" are never touched, their
    # watermarks stay at 0.
    def publish_ids(*numbers):
        for n in numbers:
            publish("orders", {"n": n}, key="k", id=f"g{n}")

    def unread():
        return ConsumerOffset.objects.unconsumed_counts("orders", ["analytics"], "default")

    publish_ids(*range(6))
    ids, _ = run_stream(spark, tmp_path, name="first", group="analytics", maxRowsPerBatch="2")
    assert sorted(ids) == [f"g{n}" for n in range(6)]
    assert unread() == {"analytics": 2}  # g4 and g5: the batch the next run commits
    publish_ids(6, 7)

    # A new checkpoint: "latest" does not skip what the group has not consumed.
    ids, _ = run_stream(spark, tmp_path, name="second", group="analytics",
                        startingPosition="latest", maxRowsPerBatch="2")
    assert sorted(ids) == ["g4", "g5", "g6", "g7"]
    assert unread() == {"analytics": 2}  # g6 and g7
    publish_ids(8)

    # And "earliest" does not read again what the group has consumed.
    ids, _ = run_stream(spark, tmp_path, name="third", group="analytics",
                        startingPosition="earliest")
    assert sorted(ids) == ["g6", "g7", "g8"]
    publish_ids(9)
    ids, _ = run_stream(spark, tmp_path, name="third", group="analytics")
    assert sorted(ids) == ["g6", "g7", "g8", "g9"]

    # GC deletes exactly what the group has consumed: everything but the last batch.
    collect_garbage(["orders"], {}, "default")
    assert list(QueueMessage.objects.filter(topic="orders").values_list("message_id", flat=True)) \
        == ["g9"]
    assert unread() == {"analytics": 1}


def test_a_grouped_stream_started_afresh_reads_each_partition_from_its_own_watermark(
        spark, tmp_path):
    ka, kb = "ka", next(key for key in (f"kb{i}" for i in range(100))
                        if partition_for(key, 12) != partition_for("ka", 12))
    for message_id, key in (("a1", ka), ("b1", kb), ("a2", ka), ("a3", ka)):
        publish("orders", {"id": message_id}, key=key, id=message_id)
    sequence_all()
    # The group's workers stopped after acking a1 and a2 in ka's partition, nothing of kb's.
    ConsumerOffset.objects.ensure("analytics", "orders", partition_names(12), "default")
    a2 = QueueMessage.objects.get(message_id="a2")
    ConsumerOffset.objects.filter(consumer_group="analytics", partition_key=a2.partition_key) \
        .update(offset_acked=a2.position, offset_fetched=a2.position)

    ids, _ = run_stream(spark, tmp_path, group="analytics", startingPosition="latest")

    assert sorted(ids) == ["a3", "b1"]


def test_a_new_group_starting_at_latest_leaves_earlier_messages_alone(spark, tmp_path):
    for i in range(3):
        publish("orders", {"n": i}, key=f"k{i}", id=f"old{i}")
    run_stream(spark, tmp_path, group="analytics", startingPosition="latest")
    # The messages before the start are not the group's: they are not its lag.
    assert ConsumerOffset.objects.unconsumed_counts("orders", ["analytics"], "default") \
        == {"analytics": 0}
    for i in range(2):
        publish("orders", {"n": i}, key=f"k{i}", id=f"new{i}")

    ids, _ = run_stream(spark, tmp_path, group="analytics")

    assert sorted(ids) == ["new0", "new1"]
    assert ConsumerOffset.objects.unconsumed_counts("orders", ["analytics"], "default") \
        == {"analytics": 2}


def test_a_grouped_stream_passes_over_a_replay_meant_for_another_group(spark, tmp_path):
    publish("orders", {"n": 1}, key="k", id="plain")
    # Replays, as the replay operation writes them (a publisher cannot set these headers).
    QueueMessageFactory(topic="orders", message_key="k", message_id="replay:7", payload={"n": 2},
                        metadata={GROUP_HEADER: "billing"})
    QueueMessageFactory(topic="orders", message_key="k", message_id="mine", payload={"n": 3},
                        metadata={GROUP_HEADER: "analytics"})

    grouped, _ = run_stream(spark, tmp_path, name="grouped", group="analytics")
    everything, _ = run_stream(spark, tmp_path, name="all")

    assert sorted(grouped) == ["mine", "plain"]
    assert sorted(everything) == ["mine", "plain", "replay:7"]  # no group: the log as it is


def test_a_stream_without_a_group_fails_when_gc_deleted_what_it_had_not_read(spark, tmp_path):
    for i in range(2):
        publish("orders", {"n": i}, key="k", id=f"d{i}")
    run_stream(spark, tmp_path)
    for i in range(2, 5):
        publish("orders", {"n": i}, key="k", id=f"d{i}")
    sequence_all()
    # A worker group acks everything and GC collects it before the stream runs again.
    message = QueueMessage.objects.filter(topic="orders").order_by("-position").first()
    ConsumerOffset.objects.create(consumer_group="billing", topic="orders",
                                  partition_key=message.partition_key, offset_acked=message.position)
    assert collect_garbage(["orders"], {}, "default") == 5
    with pytest.raises(Exception, match="deleted by GC before this stream read them"):
        run_stream(spark, tmp_path)
    ids, _ = run_stream(spark, tmp_path, name="out2", failOnDataLoss="false")
    assert ids == []


def test_a_stream_needs_named_topics(spark):
    with pytest.raises(Exception, match="a stream reads messages of named topics"):
        (spark.readStream.format("sqlqueue").option("url", database_url()).load()
         .writeStream.format("console").start().awaitTermination(60))


def test_a_stream_can_be_bulk_published_into_another_topic(spark, tmp_path):
    def copy_run():
        query = (spark.readStream.format("sqlqueue").option("url", database_url())
                 .option("topic", "orders").load()
                 .selectExpr("payload", "key", "concat('copy-', id) AS id")
                 .writeStream.format("sqlqueue").option("url", database_url())
                 .option("topic", "copies").option("partitions", "4")
                 .option("checkpointLocation", str(tmp_path / "copy.ckpt"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)

    for i in range(5):
        publish("orders", {"n": i}, key=f"k{i}", id=f"c{i}")
    copy_run()
    for i in range(5, 8):
        publish("orders", {"n": i}, key=f"k{i}", id=f"c{i}")
    copy_run()
    copies = QueueMessage.objects.filter(topic="copies")
    assert sorted(copies.values_list("message_id", flat=True)) == [f"copy-c{i}" for i in range(8)]
    assert {m.message_key: m.payload for m in copies} == {f"k{i}": {"n": i} for i in range(8)}
