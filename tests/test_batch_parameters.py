"""Statements that take a whole batch: what they write and read on every backend, and on
PostgreSQL that a batch is a few array or JSON parameters, so the statement's text is the
same whatever its size (psycopg parses a statement with more than 50 parameters afresh
each time, and the server parses and plans every new text)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from django_sqlqueue.db import arrays
from django_sqlqueue.models import DeliveryState, QueueMessage, TaskResultRecord
from django_sqlqueue.models.delivery import Hold, MessageRef
from django_sqlqueue.models.task_results import insert_started, new_row
from tests.factories import QueueMessageFactory

pytestmark = pytest.mark.django_db

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="array parameters are PostgreSQL's")
T0 = datetime(2026, 3, 29, 0, 30, 15, 123456, tzinfo=UTC)
AWKWARD = ['a,b', '{c}', 'd"e', 'f\\g', 'NULL', '', ' h ', 'ü€😀', "i'j"]


@contextlib.contextmanager
def statements() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """The (sql, params) of every statement run, as the code passed them."""
    seen: list[tuple[str, tuple[Any, ...]]] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool,
               context: Any) -> Any:
        seen.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


@postgresql_only
def test_array_literals_read_back_exactly():
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[], %s::bigint[], %s::text[]",
                       [arrays.text_array(AWKWARD),
                        arrays.int_array([0, -1, 2**62, 7]), arrays.text_array([])])
        texts, numbers, empty = cursor.fetchone()
    assert texts == AWKWARD
    assert numbers == [0, -1, 2**62, 7]
    assert empty == []


def refs(count: int) -> list[MessageRef]:
    return [MessageRef(str(n % 3), 1000 + n) for n in range(count)]


def test_delivery_rows_written_held_and_deleted_by_batch():
    DeliveryState.objects.mark_delivered("g", "t", refs(60), 5_000, "default")
    DeliveryState.objects.hold("g", "t", [Hold("7", 9000 + n, 7_000 + n) for n in range(4)],
                               "default")
    DeliveryState.objects.hold("g", "t", [Hold("0", 1000, 1)], "default")  # delivered: kept

    rows = {(r.partition_key, r.message_offset): (r.invisible_until, r.retry_count)
            for r in DeliveryState.objects.filter(consumer_group="g", topic="t")}
    assert len(rows) == 64
    assert rows[("0", 1000)] == (5_000, 0) and rows[("2", 1059)] == (5_000, 0)
    assert rows[("7", 9003)] == (7_003, -1)

    DeliveryState.objects.mark_delivered("g", "t", refs(2), 6_000, "default")  # redelivered
    assert DeliveryState.objects.get(partition_key="1", message_offset=1001).retry_count == 1

    deleted = DeliveryState.objects.delete_refs("g", "t", refs(60)[::2], "default")
    assert deleted == 30
    left = set(DeliveryState.objects.filter(consumer_group="g", topic="t", partition_key__in=
                                            ["0", "1", "2"]).values_list("message_offset",
                                                                         flat=True))
    assert left == {1000 + n for n in range(1, 60, 2)}


@postgresql_only
def test_a_batch_keeps_one_short_text_whatever_its_size():
    texts = []
    for count in (3, 60, 400):
        with statements() as seen:
            DeliveryState.objects.mark_delivered("g", "t", refs(count), 5_000, "default")
            DeliveryState.objects.delete_refs("g", "t", refs(count), "default")
        assert all(len(params) <= 8 for _, params in seen), seen
        texts.append([sql for sql, _ in seen])
    assert texts[0] == texts[1] == texts[2]


def positioned(topic: str, partition: str, positions: range) -> dict[int, int]:
    return {QueueMessageFactory(topic=topic, partition_key=partition, position=p).offset: p
            for p in positions}


def test_offsets_between_reads_each_partition_s_range():
    first = positioned("t", "0", range(1, 21))
    second = positioned("t", "1", range(1, 11))
    positioned("other", "0", range(1, 21))

    found = QueueMessage.objects.offsets_between("t", {"0": (4, 9), "1": (0, 2)}, "default")

    expected = {("0", o) for o, p in first.items() if 4 < p <= 9}
    expected |= {("1", o) for o, p in second.items() if p <= 2}
    assert sorted(found) == sorted(expected)
    assert len(found) == 7


@postgresql_only
def test_offsets_between_reads_only_its_ranges_when_the_statistics_say_the_log_is_empty():
    """The planner once read a disjunction of ranges as a bitmap of every message of the
    partitions, so a watermark move read the whole backlog: with statistics taken while
    the log was empty, the read must still touch a few pages, not thousands of rows."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_messages")
    for partition in ("0", "1", "2"):
        QueueMessage.objects.bulk_create(
            QueueMessageFactory.build(topic="t", partition_key=partition, position=p)
            for p in range(1, 3001))
    with statements() as seen:
        QueueMessage.objects.offsets_between(
            "t", {"0": (100, 105), "1": (2000, 2005), "2": (2990, 2995)}, "default")
    (sql, params), = seen
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0][0]["Plan"]
    assert plan["Actual Rows"] == 15
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 100, plan


def test_first_attempts_round_trip_every_column():
    rows = [TaskResultRecord(
        id=f"id-{n}", task_path="tests.testapp.tasks.add", backend="default",
        queue_name=name, priority=n - 1, status="RUNNING",
        args=[1, "two", None, {"ü": [2.5]}], kwargs={"q": name, "deep": {"x": [True]}},
        run_after=None if n else T0, enqueued_at=T0, started_at=T0 + timedelta(microseconds=n),
        last_attempted_at=T0 + timedelta(seconds=n), worker_ids=[f"w{n}"], errors=[],
        return_value=None) for n, name in enumerate(AWKWARD)]

    inserted = insert_started(rows, "default")

    assert inserted == {row.id for row in rows}
    stored = TaskResultRecord.objects.in_bulk([row.id for row in rows])
    for row in rows:
        fresh = stored[row.id]
        for field in TaskResultRecord._meta.concrete_fields:
            assert getattr(fresh, field.attname) == getattr(row, field.attname), field.name


@pytest.mark.skipif(connection.vendor == "mysql", reason="MySQL cannot skip and say which")
def test_first_attempts_skip_rows_stored_already_and_say_which_they_wrote():
    def row(n: int, path: str) -> TaskResultRecord:
        return TaskResultRecord(id=f"id-{n}", task_path=path, backend="default",
                                queue_name="q", status="RUNNING", enqueued_at=T0)

    insert_started([row(1, "first")], "default")
    inserted = insert_started([row(1, "second"), row(2, "second")], "default",
                              skip_existing=True)

    assert inserted == {"id-2"}
    assert TaskResultRecord.objects.get(id="id-1").task_path == "first"


def test_json_columns_of_task_results_have_no_encoder_of_their_own():
    """The PostgreSQL batch writes JSON columns with the json module's own encoding."""
    for field in TaskResultRecord._meta.concrete_fields:
        assert getattr(field, "encoder", None) is None, field.name


def test_a_new_row_takes_every_default_its_model_would():
    made = [new_row(id=f"n{n}", task_path="p", backend="default", queue_name="q",
                    enqueued_at=T0) for n in range(2)]
    model = TaskResultRecord(id="n0", task_path="p", backend="default", queue_name="q",
                             enqueued_at=T0)
    for field in TaskResultRecord._meta.concrete_fields:
        assert getattr(made[0], field.attname) == getattr(model, field.attname), field.name
    made[0].args.append(1)
    assert made[1].args == []  # a default list of its own
    made[1].save()
    assert TaskResultRecord.objects.get(id="n1").status == "READY"
    with pytest.raises(TypeError, match="no field 'colour'"):
        new_row(id="x", colour="red")
