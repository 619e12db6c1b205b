"""The sqlqueue data source in batch: bulk publish and reading back, on the test database."""

from __future__ import annotations

import json
import time
from datetime import UTC

import pytest
from django.db import connection

from django_sqlqueue import publish
from django_sqlqueue.encoding import build_row
from django_sqlqueue.models import QueueMessage
from django_sqlqueue.sequencing import partition_counts, sequence_all
from django_sqlqueue.store import messages as message_store
from django_sqlqueue.store.connection import open_connection
from tests.helpers import start_thread
from tests.spark_support import database_url, kill_python_workers
from tests.worker_harness import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


@pytest.fixture(autouse=True)
def orders_topic():
    """Record "orders" as a worker would (12 partitions in the test settings)."""
    partition_counts(["orders"], "default")


def write(spark, rows, schema, **options):
    df = spark.createDataFrame(rows, schema)
    writer = df.write.format("sqlqueue").option("url", database_url()).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def read(spark, **options):
    reader = spark.read.format("sqlqueue").option("url", database_url())
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_read_returns_what_publish_wrote(spark):
    published = [publish("orders", {"n": i, "text": "é✓"}, key=f"k{i % 3}", id=f"id-{i}",
                         headers={"h": str(i)}) for i in range(25)]
    sequence_all()
    rows = read(spark, topic="orders", numPartitions="3").orderBy("offset").collect()
    assert [r["offset"] for r in rows] == [m.offset for m in published]
    for row, message in zip(rows, published, strict=True):
        assert (row["key"], row["id"], json.loads(row["payload"]), json.loads(row["headers"])) == \
            (message.key, message.id, message.payload, message.headers)
        assert row["published_at"].replace(tzinfo=UTC) == message.published_at
        assert row["position"] is not None and row["partition"] is not None
        assert row["topic"] == "orders" and row["consumer_group"] == ""


def test_batch_read_includes_unsequenced_messages_with_null_position(spark):
    publish("orders", {"n": 1}, id="a")
    rows = read(spark, topic="orders").collect()
    assert [(r["id"], r["position"], r["partition"]) for r in rows] == [("a", None, None)]


def test_written_rows_are_published_like_publish_does(spark):
    rows = [(json.dumps({"n": i}), f"k{i % 4}", f"id-{i}", {"source": "spark"}, 0.0)
            for i in range(50)]
    write(spark, rows, "payload string, key string, id string, headers map<string,string>, "
          "delay double", topic="orders")
    stored = {m.message_id: m for m in QueueMessage.objects.filter(topic="orders")}
    assert len(stored) == 50
    assert stored["id-7"].payload == {"n": 7} and stored["id-7"].message_key == "k3"
    assert stored["id-7"].metadata == {"source": "spark"}
    sequence_all()
    # The sequencer maps keys to partitions exactly as for publish(): crc32 % 12 ("orders").
    import zlib
    for message in QueueMessage.objects.filter(topic="orders"):
        assert message.partition_key == str(zlib.crc32(message.message_key.encode()) % 12)


def test_writing_the_same_dataframe_twice_makes_no_duplicates(spark):
    rows = [(json.dumps({"n": i}), f"k{i}", f"id-{i}") for i in range(30)]
    for _ in range(2):
        write(spark, rows, "payload string, key string, id string", topic="orders")
    assert QueueMessage.objects.filter(topic="orders").count() == 30


def test_a_task_killed_mid_write_and_retried_makes_no_duplicates(spark):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has a single writer: the held row would hold up every batch")
    from pyspark.sql import functions as F

    url = database_url()
    # Another transaction holds row 1500's (topic, key, id): the task commits 15 batches of
    # 100 rows, then waits on it; there it is killed, and Spark tries the task again.
    held = open_connection(url)
    held.begin()
    message_store.insert_rows(held, [build_row("orders", 1500, "", "1500", None, None, 1 << 20)])
    df = spark.range(2000).repartition(1).select(
        F.to_json(F.struct("id")).alias("payload"), F.col("id").cast("string").alias("id"))

    def kill_the_task_then_let_go():
        wait_until(lambda: QueueMessage.objects.filter(topic="orders").count() == 1500, timeout=60,
                   what="the task to commit 15 batches")
        killed = kill_python_workers(spark)
        time.sleep(1)
        held.rollback()
        return killed

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        # The job runs in the test's thread: from another Python thread Spark did not find
        # the registered data source.
        killer = start_thread(kill_the_task_then_let_go)
        (df.write.format("sqlqueue").option("url", url).option("topic", "orders")
         .option("batchSize", "100").mode("append").save())
        assert killer.outcome(timeout=60) > 0
    finally:
        held.close()
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    ids = list(QueueMessage.objects.filter(topic="orders").values_list("message_id", flat=True))
    assert sorted(ids, key=int) == [str(i) for i in range(2000)]


def test_struct_payload_and_id_columns(spark):
    rows = [(i, f"name-{i}", {"a": str(i)}) for i in range(10)]
    df = spark.createDataFrame(rows, "order_id int, name string, tags map<string,string>")
    from pyspark.sql import functions as F
    out = df.select(F.struct("order_id", "name", "tags").alias("payload"), "order_id")
    for _ in range(2):
        (out.write.format("sqlqueue").option("url", database_url()).option("topic", "orders")
         .option("idColumns", "order_id").mode("append").save())
    payloads = sorted((m.payload for m in QueueMessage.objects.filter(topic="orders")),
                      key=lambda p: p["order_id"])
    assert len(payloads) == 10
    assert payloads[3] == {"order_id": 3, "name": "name-3", "tags": {"a": "3"}}


def test_writing_a_new_topic_needs_its_partition_count(spark):
    rows = [(json.dumps(1), "x")]
    with pytest.raises(Exception, match="no recorded partition count"):
        write(spark, rows, "payload string, id string", topic="brand-new")
    write(spark, rows, "payload string, id string", topic="brand-new", partitions="8")
    from django_sqlqueue.models import Topic
    assert Topic.objects.get(topic="brand-new").partitions == 8


@pytest.mark.parametrize(("schema", "rows", "options", "error"), [
    ("payload string, id string", [("1", "a")], {"url": None}, "option url is required"),
    ("payload string", [("1",)], {}, "an id column or option idColumns is required"),
    ("payload string, id string", [("1", "a")], {"topic": None, "topicColumn": "t"},
     "option topicColumn names 't', which is not a column"),
    ("payload binary, id string", [(b"1", "a")], {}, "column 'payload' must be"),
    ("payload string, id int", [("1", 1)], {}, "column 'id' must be a string"),
    ("payload string, id string, extra int", [("1", "a", 1)], {}, "'extra' are not message fields"),
    ("payload string, id string", [("1", "a")], {"idColumns": "nope"}, "idColumns names 'nope'"),
    ("payload string, id string", [("1", "a")], {"batchSize": "many"},
     "option batchSize must be an integer"),
])
def test_bad_write_options_are_refused_on_the_driver(spark, schema, rows, options, error):
    df = spark.createDataFrame(rows, schema)
    writer = df.write.format("sqlqueue").mode("append")
    settings = {"url": database_url(), "topic": "orders", **options}
    for name, value in settings.items():
        if value is not None:
            writer = writer.option(name, value)
    with pytest.raises(Exception, match=error):
        writer.save()
    assert QueueMessage.objects.count() == 0


def test_invalid_json_payload_fails_the_write_naming_the_row(spark):
    with pytest.raises(Exception, match="row with id 'bad' cannot be published: payload is not valid JSON"):
        write(spark, [("{not json", "bad")], "payload string, id string", topic="orders")


def test_nul_in_payload_is_refused_as_publish_refuses_it(spark):
    with pytest.raises(Exception, match="contains a NUL character"):
        write(spark, [(json.dumps({"a": "x\x00y"}), "nul")], "payload string, id string",
              topic="orders")


def test_overwrite_is_refused(spark):
    df = spark.createDataFrame([("1", "a")], "payload string, id string")
    with pytest.raises(Exception, match="append-only"):
        (df.write.format("sqlqueue").option("url", database_url()).option("topic", "orders")
         .mode("overwrite").save())


def test_password_is_never_shown(spark):
    with pytest.raises(Exception) as failure:
        (spark.read.format("sqlqueue").option("url", "mysql://u:s3cret-pw@127.0.0.1:1/db")
         .option("topic", "orders").load().collect())
    assert "s3cret-pw" not in str(failure.value)
    assert "***" in str(failure.value)


def test_reading_state_tables_gives_lag_per_group(spark):
    from django_sqlqueue.models import ConsumerOffset
    for i in range(6):
        publish("orders", {"n": i}, key="k", id=str(i))
    sequence_all()
    partition = QueueMessage.objects.filter(topic="orders").first().partition_key
    positions = sorted(QueueMessage.objects.filter(topic="orders").values_list("position", flat=True))
    ConsumerOffset.objects.create(consumer_group="billing", topic="orders",
                                  partition_key=partition, offset_acked=positions[1])
    messages = read(spark, topic="orders")
    offsets = read(spark, table="offsets", topic="orders")
    lag = (messages.select("topic", "partition", "position").join(offsets, ["topic", "partition"])
           .where("position > offset_acked").groupBy("consumer_group").count().collect())
    assert [(r["consumer_group"], r["count"]) for r in lag] == [("billing", 4)]


@pytest.mark.parametrize(("options", "error"), [
    ({"topic": None}, "option topic is required to read messages"),
    ({"table": "nope"}, "option table must be one of messages, dead_letters"),
    ({"numPartitions": "two"}, "option numPartitions must be an integer"),
    ({"topic": "bad topic"}, "option topic: topic 'bad topic' contains ' '"),
    ({"url": "ftp://example.com/x"}, "is not a MariaDB/MySQL, PostgreSQL or SQLite url"),
])
def test_bad_read_options_are_refused(spark, options, error):
    reader = spark.read.format("sqlqueue")
    for name, value in {"url": database_url(), "topic": "orders", **options}.items():
        if value is not None:
            reader = reader.option(name, value)
    with pytest.raises(Exception, match=error):
        reader.load().collect()
