"""What each ``table`` option reads: its Spark schema, its SQL, and Arrow conversion.

Times are stored as epoch milliseconds (database clock) and read as UTC timestamps; 0,
the tables' "never", reads as null. Partitions are stored as text and read as integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..store.connection import Connection

LONG, INT, STRING, TIME, BOOL = "bigint", "int", "string", "timestamp", "boolean"
PARTITION = "partition"  # stored as text ('' until sequenced), read as an int
_ARROW = {LONG: pa.int64(), INT: pa.int32(), STRING: pa.string(),
          TIME: pa.timestamp("us", tz="UTC"), BOOL: pa.bool_(), PARTITION: pa.int32()}
_SPARK = {PARTITION: INT}

MESSAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("offset", LONG), ("position", LONG), ("topic", STRING), ("partition", PARTITION),
    ("key", STRING), ("id", STRING), ("payload", STRING), ("headers", STRING),
    ("published_at", TIME), ("deliver_at", TIME), ("consumer_group", STRING),
    ("original_topic", STRING), ("original_offset", LONG), ("original_id", STRING),
    ("failure_count", INT), ("last_error", STRING), ("failed_at", TIME),
)

# The queue's state tables: (table, [(column as read, SQL column, type)]).
STATE_TABLES: dict[str, tuple[str, tuple[tuple[str, str, str], ...]]] = {
    "delivery": ("queue_delivery_state", (
        ("consumer_group", "consumer_group", STRING), ("topic", "topic", STRING),
        ("partition", "partition_key", PARTITION), ("message_offset", "message_offset", LONG),
        ("acked", "acked", BOOL), ("invisible_until", "invisible_until", TIME),
        ("retry_count", "retry_count", INT), ("last_error", "last_error", STRING))),
    "offsets": ("queue_offsets", (
        ("consumer_group", "consumer_group", STRING), ("topic", "topic", STRING),
        ("partition", "partition_key", PARTITION), ("offset_acked", "offset_acked", LONG),
        ("offset_fetched", "offset_fetched", LONG), ("updated_at", "updated_at", TIME))),
    "leases": ("queue_partition_leases", (
        ("consumer_group", "consumer_group", STRING), ("topic", "topic", STRING),
        ("partition", "partition_key", PARTITION), ("leased_by", "leased_by", STRING),
        ("leased_at", "leased_at", TIME), ("lease_renewed_at", "lease_renewed_at", TIME),
        ("generation", "generation", LONG))),
    "heartbeats": ("queue_subscriber_heartbeats", (
        ("consumer_group", "consumer_group", STRING), ("topic", "topic", STRING),
        ("subscriber_name", "subscriber_name", STRING), ("heartbeat_at", "heartbeat_at", TIME),
        ("deregistered_at", "deregistered_at", TIME))),
}


def columns_of(table: str) -> tuple[tuple[str, str], ...]:
    if table in ("messages", "dead_letters"):
        return MESSAGE_COLUMNS
    return tuple((name, kind) for name, _, kind in STATE_TABLES[table][1])


def ddl(table: str) -> str:
    """The Spark schema of ``table`` as DDL (backticks: ``offset`` and ``key`` are words)."""
    return ", ".join(f"`{name}` {_SPARK.get(kind, kind)}" for name, kind in columns_of(table))


def arrow_schema(table: str) -> pa.Schema:
    return pa.schema([(name, _ARROW[kind]) for name, kind in columns_of(table)])


def _column(values: Sequence[Any], kind: str) -> pa.Array:
    """One column as an Arrow array, converted column-wise (a million rows per read)."""
    if kind == TIME:
        millis = pa.array(values, type=pa.int64())
        never = pc.equal(millis, 0)
        return pc.if_else(never, pa.scalar(None, pa.int64()), pc.multiply(millis, 1000)).cast(
            _ARROW[TIME])
    if kind == PARTITION:
        text = pa.array(values, type=pa.string())
        return pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text).cast(pa.int32())
    if kind == BOOL:
        return pa.array([None if v is None else bool(v) for v in values], type=pa.bool_())
    return pa.array(values, type=_ARROW[kind])


def to_batch(table: str, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """Rows (tuples in the table's column order) as one Arrow record batch."""
    columns = columns_of(table)
    values = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
    arrays = [_column(values[index], kind) for index, (_, kind) in enumerate(columns)]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(table))


def read_state(conn: Connection, table: str, topics: Sequence[str]) -> list[tuple[Any, ...]]:
    """Every row of a state table (of ``topics`` when given)."""
    name, columns = STATE_TABLES[table]
    q = conn.q
    where = ""
    params: list[Any] = []
    if topics:
        where = f" WHERE {q('topic')} IN ({', '.join(['%s'] * len(topics))})"
        params = list(topics)
    return conn.fetch_all(
        f"SELECT {', '.join(q(sql) for _, sql, _ in columns)} FROM {q(name)}{where}",  # noqa: S608 - names quoted, values bound
        params,
    )
