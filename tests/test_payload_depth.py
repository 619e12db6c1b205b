"""One nesting limit for payloads, MAX_PAYLOAD_DEPTH, on every backend and Python version.

publish(), publish_many() and the Spark writer refuse a deeper payload, naming its depth and
the limit, without hitting RecursionError however deep it is. A deeper one already stored
(by another release, or written straight into the table) is dead-lettered by the worker
with that reason, and the rest of its partition goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.limits import MAX_PAYLOAD_DEPTH
from django_sqlqueue.models import DeadLetter, QueueMessage
from tests.testapp.models import Handled
from tests.worker_harness import wait_until, worker_pool

pytestmark = pytest.mark.django_db(transaction=True)


def nested(levels: int, leaf: Any = 0) -> Any:
    value = leaf
    for level in range(levels):
        value = [value] if level % 2 else {"a": value}
    return value


def nested_json(levels: int) -> str:
    """JSON text ``levels`` arrays deep, built without the encoder."""
    return "[" * levels + "0" + "]" * levels


def refusal(levels: int) -> str:
    return re.escape(f"nested too deeply: {levels} levels of arrays and objects, over the "
                     f"limit of {MAX_PAYLOAD_DEPTH} (MAX_PAYLOAD_DEPTH)")


# --------------------------------------------------------------------------- publishing


def test_a_payload_at_the_limit_is_stored_and_read_back_on_every_backend():
    payload = nested(MAX_PAYLOAD_DEPTH, leaf="[{not a bracket}]")

    stored = sqlqueue.publish("orders", payload)

    assert QueueMessage.objects.get(offset=stored.offset).payload == payload
    assert stored.payload == payload


@pytest.mark.parametrize("levels", [MAX_PAYLOAD_DEPTH + 1, 500, 1_000, 100_000])
def test_publish_refuses_a_payload_deeper_than_the_limit_naming_its_depth(levels):
    # 1,000 levels is about where Python's own recursion gives out on 3.11; 100,000 is past
    # it on every version: the depth is measured without recursion either way.
    with transaction.atomic():
        with pytest.raises(sqlqueue.InvalidMessage, match=refusal(levels)):
            sqlqueue.publish("orders", nested(levels))
        sqlqueue.publish("orders", "after")  # the transaction is unharmed

    assert list(QueueMessage.objects.values_list("payload", flat=True)) == ["after"]


def test_publish_many_refuses_the_whole_call_for_one_payload_too_deep():
    messages = [{"payload": 1}, {"payload": nested(MAX_PAYLOAD_DEPTH + 1)}, {"payload": 3}]

    with pytest.raises(sqlqueue.InvalidMessage,
                       match=r"messages\[1\]: payload is " + refusal(MAX_PAYLOAD_DEPTH + 1)):
        sqlqueue.publish_many("orders", messages)

    assert not QueueMessage.objects.exists()


def test_brackets_inside_strings_do_not_count_towards_the_depth():
    payload = {"text": "[" * 100 + '"' + "{" * 100, "escaped": '\\"[[[[[[[['}

    stored = sqlqueue.publish("orders", payload)

    assert stored.payload == payload


# --------------------------------------------------------------------------- Spark writer


def spark_write(payload_text: str) -> None:
    """One write task of one row, as ``df.write.format("sqlqueue")`` runs it."""
    from tests.spark_support import database_url, require_spark

    require_spark()
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from django_sqlqueue.sequencing import partition_counts
    from django_sqlqueue.spark.source import SqlQueueDataSource

    partition_counts(["orders"], "default")
    schema = StructType([StructField(n, StringType()) for n in ("payload", "key", "id")])
    writer = SqlQueueDataSource({"url": database_url(), "topic": "orders"}).writer(
        schema, overwrite=False)
    batch = pa.RecordBatch.from_pylist([{"payload": payload_text, "key": "k", "id": "deep"}],
                                       schema=pa.schema([(n, pa.string()) for n in schema.names]))
    writer.commit([writer.write(iter([batch]))])


@pytest.mark.parametrize("levels", [MAX_PAYLOAD_DEPTH + 1, 100_000])
def test_the_spark_writer_refuses_payload_text_deeper_than_the_limit(levels):
    with pytest.raises(sqlqueue.InvalidMessage, match="row with id 'deep'.*" + refusal(levels)):
        spark_write(nested_json(levels))

    assert not QueueMessage.objects.exists()


def test_the_spark_writer_stores_payload_text_at_the_limit():
    spark_write(json.dumps(nested(MAX_PAYLOAD_DEPTH)))

    assert QueueMessage.objects.get().payload == nested(MAX_PAYLOAD_DEPTH)


# --------------------------------------------------------------------------- the worker


@contextmanager
def json_checks_off() -> Iterator[None]:
    """The JSON checks of MariaDB (more than 31 levels) and SQLite (more than 2,000) off
    for this session, as whatever wrote the row past them had them."""
    switch = {"mysql": "SET SESSION check_constraint_checks = %s",
              "sqlite": "PRAGMA ignore_check_constraints = %s"}.get(connection.vendor)
    if switch is None:  # PostgreSQL's jsonb takes any depth
        yield
        return
    on, off = ("1", "0") if connection.vendor == "mysql" else ("0", "1")
    with connection.cursor() as cursor:
        cursor.execute(switch % off)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(switch % on)


def store_directly(offset: int, column: str, text: str) -> None:
    """Write JSON ``text`` into a stored message's ``column``, past publish()."""
    cast = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    q = connection.ops.quote_name
    with json_checks_off(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE queue_messages SET {q(column)} = {cast} WHERE {q('offset')} = %s",
                       [text, offset])


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


@pytest.mark.worker
@pytest.mark.compat
@pytest.mark.parametrize("column", ["payload", "metadata"])
def test_a_stored_message_nested_too_deeply_is_dead_lettered_and_its_partition_goes_on(
        workers, column):
    if connection.vendor == "mysql":
        pytest.skip("MariaDB and MySQL store no JSON deeper than their limits (32, 100), "
                    "which MAX_PAYLOAD_DEPTH is within: the column's check or JSON type "
                    "refuses it, and the row's generated search column cannot be computed")
    # "slow" has one partition: the good messages are behind the deep one.
    deep = sqlqueue.publish("slow", {"placeholder": True})
    # As deep as the backend stores: past what Python decodes on 3.11 and 3.12 (and on
    # 3.13 for PostgreSQL). SQLite's JSON functions refuse more than 2,000 levels
    # whatever the checks say, and PostgreSQL's parser is bounded by its stack.
    levels = 2_000 if connection.vendor == "sqlite" else 10_500
    store_directly(deep.offset, column, nested_json(levels) if column == "payload"
                   else '{"h": ' + nested_json(levels - 1) + "}")
    good = [sqlqueue.publish("slow", {"n": n}).offset for n in range(3)]

    worker = workers.start("deep", "--topic", "slow", "--group", "billing")

    wait_until(lambda: set(Handled.objects.values_list("offset", flat=True)) >= set(good),
               what="the messages behind the deep one handled", watch=[worker])
    # Not the model: loading it would decode the payload.
    [(group, error)] = wait_until(
        lambda: list(DeadLetter.objects.filter(original_offset=deep.offset)
                     .values_list("consumer_group", "last_error")),
        what="the deep message dead-lettered", watch=[worker])
    what = "payload" if column == "payload" else "headers"
    assert f"{what} is nested too deeply: {levels} levels" in error
    assert group == "billing"
    assert not Handled.objects.filter(offset=deep.offset).exists()
    assert "RecursionError" not in worker.stderr
    assert "poll cycle failed" not in worker.stderr
