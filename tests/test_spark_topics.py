"""The Spark data source and the queue's own rules: reserved headers, and topics with or
without a recorded partition count."""

from __future__ import annotations

import json

import pytest

from django_sqlqueue import publish
from django_sqlqueue.models import QueueMessage, Topic
from django_sqlqueue.replays import GROUP_HEADER
from tests.spark_support import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


def write(spark, rows, schema, **options):
    df = spark.createDataFrame(rows, schema).coalesce(1)  # one task: all its rows or none
    writer = df.write.format("sqlqueue").option("url", database_url()).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def test_the_writer_refuses_a_reserved_header_naming_it_and_writes_nothing(spark):
    rows = [(json.dumps(1), "ok", {"trace": "t"}),
            (json.dumps(2), "forged", {GROUP_HEADER: "billing"})]

    with pytest.raises(Exception, match=f"row with id 'forged' cannot be published: "
                                        f"header '{GROUP_HEADER}' is reserved"):
        write(spark, rows, "payload string, id string, headers map<string,string>",
              topic="orders")

    assert QueueMessage.objects.count() == 0


def test_the_writer_refuses_a_reserved_header_given_as_json_text(spark):
    rows = [(json.dumps(1), "forged", json.dumps({"SQLQueue-Replay-Group": "billing"}))]

    with pytest.raises(Exception, match="header 'SQLQueue-Replay-Group' is reserved"):
        write(spark, rows, "payload string, id string, headers string", topic="orders")

    assert QueueMessage.objects.count() == 0


def test_a_topic_named_in_the_settings_takes_writes_without_the_partitions_option(spark):
    # "slow" has one partition in the test settings; migrate recorded it.
    assert Topic.objects.get(topic="slow").partitions == 1

    write(spark, [(json.dumps(1), "a")], "payload string, id string", topic="slow")

    assert QueueMessage.objects.get(topic="slow").message_id == "a"


def test_a_stream_of_a_topic_without_a_partition_count_fails_saying_so(spark, tmp_path):
    publish("unrecorded", {"n": 1})
    reader = (spark.readStream.format("sqlqueue").option("url", database_url())
              .option("topic", "unrecorded").load())
    query = (reader.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())

    with pytest.raises(Exception, match="'unrecorded' have no recorded partition count"):
        query.awaitTermination(120)
