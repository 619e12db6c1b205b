"""Rows bulk-published by Spark are handled by runqueueworker subscribers as written."""

from __future__ import annotations

import json

import pytest

from tests.spark_support import database_url
from tests.testapp.models import Handled
from tests.worker_harness import run_command

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]

ROWS = [
    ('{"order": 1, "lines": [{"sku": "a", "qty": 2}]}', "customer-7", "order-1",
     {"trace": "t-1", "source": "backfill"}),
    ('"just text: é ✓"', "customer-7", "order-2", {}),
    ("null", None, "order-3", {"trace": "t-3"}),
    ('{"order": 4}', "customer-9", "order-4", None),
]


def test_rows_written_by_spark_reach_a_subscriber_as_written(spark):
    df = spark.createDataFrame(
        ROWS, "payload string, key string, id string, headers map<string,string>")
    (df.write.format("sqlqueue").option("url", database_url()).option("topic", "sparkfed")
     .option("partitions", "4").mode("append").save())

    worker = run_command("--topic", "sparkfed", "--burst", "--name", "spark-fed", timeout=60)

    assert worker.returncode == 0, worker.stderr
    handled = {row.message_id: row for row in Handled.objects.filter(topic="sparkfed")}
    assert sorted(handled) == ["order-1", "order-2", "order-3", "order-4"]
    assert {row.attempt for row in handled.values()} == {1}
    for payload, key, message_id, headers in ROWS:
        row = handled[message_id]
        assert row.group == "downstream"
        assert row.key == (key or "")
        assert row.payload == {"payload": json.loads(payload),
                               "headers": headers or {}}
    # A key's messages are handled in the order they were written.
    assert handled["order-1"].offset < handled["order-2"].offset
