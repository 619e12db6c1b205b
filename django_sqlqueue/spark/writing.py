"""Bulk publish: a DataFrame's rows appended to the log, idempotently, by every task.

Each task turns its Arrow batches into the rows publish() would store (one
implementation: :func:`django_sqlqueue.encoding.build_row`) and appends them with
multi-row INSERTs that skip a stored (topic, key, id), committing each. A retried task,
or the whole job run again, therefore adds nothing twice; that needs a stable id per row,
so an ``id`` column or the ``idColumns`` option is required, checked on the driver.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from ..encoding import (
    PUBLISH_BATCH_BYTES,
    ROW_OVERHEAD_BYTES,
    NewRow,
    build_row,
    depth_error,
    too_deep,
    validate_topic,
)
from ..exceptions import InvalidMessage, SQLQueueError
from ..store import messages as message_store
from ..store import topics as topic_store
from ..store.connection import Connection, open_connection
from .options import Options, SparkOptionError

logger = logging.getLogger("django_sqlqueue.spark")

MESSAGE_FIELDS = ("payload", "key", "id", "headers", "delay")
INSERT_ATTEMPTS = 3  # a deadlock or a lost connection is retried; the INSERT is idempotent
_NUMBERS = (ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType)


@dataclass(frozen=True)
class WritePlan:
    """What the driver worked out about a write, handed to every task."""

    options: Options
    payload_is_text: bool
    headers_is_text: bool
    columns: tuple[str, ...]


@dataclass
class Written(WriterCommitMessage):
    rows: int
    inserted: int


def check_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise SparkOptionError(
            'the log is append-only: write with .mode("append") (a rerun adds nothing twice)')


def plan_write(options: Options, schema: StructType) -> WritePlan:
    """Check the DataFrame's columns and the target topic on the driver."""
    fields = {field.name: field.dataType for field in schema.fields}
    if options.table != "messages":
        raise SparkOptionError("only messages can be written: drop the table option")
    if options.topic_column is None:
        if len(options.topics) != 1:
            raise SparkOptionError(
                'option topic is required and names one topic: .option("topic", "orders"), or '
                'take each row\'s topic from a column with .option("topicColumn", "name")')
    elif options.topic_column not in fields:
        raise SparkOptionError(
            f"option topicColumn names {options.topic_column!r}, which is not a column "
            f"(columns: {', '.join(fields)})")
    elif not isinstance(fields[options.topic_column], StringType):
        raise SparkOptionError(f"column {options.topic_column!r} (the topic) must be a string")
    if "payload" not in fields:
        raise SparkOptionError(
            f"a payload column is required (columns: {', '.join(fields)}); e.g. "
            "df.select(to_json(struct(...)).alias('payload'), ...)")
    missing = [name for name in options.id_columns if name not in fields]
    if missing:
        raise SparkOptionError(
            f"option idColumns names {', '.join(map(repr, missing))}, not columns of the DataFrame")
    if "id" in fields and options.id_columns:
        raise SparkOptionError("give either an id column or option idColumns, not both")
    if "id" not in fields and not options.id_columns:
        raise SparkOptionError(
            "an id column or option idColumns is required: without a stable id per row a retried "
            "task or a rerun would publish its rows twice. Add .withColumn('id', ...) or "
            '.option("idColumns", "order_id") to derive the id from columns')
    extra = [name for name in fields if name not in MESSAGE_FIELDS
             and name not in options.id_columns and name != options.topic_column]
    if extra:
        raise SparkOptionError(
            f"column(s) {', '.join(map(repr, extra))} are not message fields; select payload, and "
            "optionally key, id, headers and delay (or name them in idColumns)")
    _check_type("payload", fields["payload"], (StringType, StructType, MapType, ArrayType),
                "a string of JSON text, or a struct, map or array (written as JSON)")
    for name in ("key", "id"):
        if name in fields:
            _check_type(name, fields[name], (StringType,), "a string")
    if "headers" in fields:
        headers = fields["headers"]
        if not (isinstance(headers, StringType) or (
                isinstance(headers, MapType) and isinstance(headers.keyType, StringType)
                and isinstance(headers.valueType, StringType))):
            raise SparkOptionError(
                f"column 'headers' must be a map<string,string> or a string of JSON text, "
                f"got {headers.simpleString()}")
    if "delay" in fields:
        _check_type("delay", fields["delay"], _NUMBERS, "a number of seconds")
    if options.topics:
        _ensure_topic(options, options.topics[0])
    return WritePlan(options, isinstance(fields["payload"], StringType),
                     isinstance(fields.get("headers"), StringType), tuple(fields))


def _check_type(name: str, data_type: DataType, allowed: tuple[type, ...], what: str) -> None:
    if isinstance(data_type, BinaryType) or not isinstance(data_type, allowed):
        raise SparkOptionError(f"column {name!r} must be {what}, got {data_type.simpleString()}")


def _ensure_topic(options: Options, topic: str) -> int:
    """The topic's recorded partition count, recording option ``partitions`` for a new one.

    The data source has no ``SQLQUEUE`` settings, so it cannot know a new topic's
    configured count: it refuses instead of guessing one that would map keys differently
    from the workers' setting.
    """
    with open_connection(options.url) as conn, conn.atomic():
        counts = topic_store.partition_counts(conn, [topic])
        if topic in counts:
            return counts[topic]
        if options.partitions is None:
            raise SparkOptionError(
                f"topic {topic!r} has no recorded partition count yet; pass "
                f'.option("partitions", N) with the count SQLQUEUE["TOPICS"] (or '
                f'SQLQUEUE["PARTITIONS"]) gives it, or start a runqueueworker for it first')
        return topic_store.record(conn, {topic: options.partitions})[topic]


def _plain(data_type: pa.DataType) -> Callable[[Any], Any] | None:
    """A function turning Arrow's Python value of ``data_type`` into JSON-ready values (a
    map arrives as a list of pairs), or None where the value is ready as it is."""
    if pa.types.is_map(data_type):
        item = _plain(data_type.item_type)
        return lambda v: None if v is None else {k: _apply(item, x) for k, x in v}
    if pa.types.is_struct(data_type):
        fields = {data_type.field(i).name: _plain(data_type.field(i).type)
                  for i in range(data_type.num_fields)}
        if not any(fields.values()):
            return None
        return lambda v: None if v is None else {k: _apply(fields.get(k), x) for k, x in v.items()}
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        item = _plain(data_type.value_type)
        if item is None:
            return None
        return lambda v: None if v is None else [item(x) for x in v]
    return None


def _apply(convert: Callable[[Any], Any] | None, value: Any) -> Any:
    return convert(value) if convert is not None else value


class _TaskWriter:
    """Turns Arrow batches into log rows and appends them (one per task)."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan
        self.counts: dict[str, int] = {}

    def run(self, batches: Iterator[pa.RecordBatch]) -> Written:
        rows = inserted = 0
        with open_connection(self.plan.options.url) as conn:
            for batch in batches:
                built = self._rows(conn, batch)
                rows += len(built)
                for chunk in self._chunks(built):
                    inserted += self._insert(conn, chunk)
        return Written(rows, inserted)

    def _rows(self, conn: Connection, batch: pa.RecordBatch) -> list[NewRow]:
        plan, options = self.plan, self.plan.options
        columns = {}
        for name in batch.schema.names:
            values = batch.column(name).to_pylist()
            convert = _plain(batch.schema.field(name).type)
            columns[name] = [convert(v) for v in values] if convert else values
        count = batch.num_rows
        payloads = columns["payload"]
        keys = columns.get("key") or [None] * count
        ids = columns.get("id") or [_derived_id([columns[c][i] for c in options.id_columns])
                                    for i in range(count)]
        headers = columns.get("headers") or [None] * count
        delays = columns.get("delay") or [None] * count
        topics = (columns[options.topic_column] if options.topic_column
                  else [options.topics[0]] * count)
        result = []
        for index in range(count):
            message_id = ids[index]
            try:
                topic = topics[index]
                if options.topic_column:
                    self._check_topic(conn, topic)
                if message_id is None:
                    raise InvalidMessage("id is null; every row needs an id")
                payload = payloads[index]
                if payload is None:
                    raise InvalidMessage("payload is null (write the JSON text 'null' for a null payload)")
                if plan.payload_is_text:
                    payload = _json("payload", payload)
                header = headers[index]
                if plan.headers_is_text and header is not None:
                    header = _json("headers", header)
                delay = delays[index]
                if delay is not None and not isinstance(delay, int | float):
                    delay = float(delay)  # a Decimal
                result.append(build_row(topic, payload, keys[index] or "", message_id, header,
                                        delay, options.max_payload_bytes))
            except InvalidMessage as exc:
                raise InvalidMessage(
                    f"row with id {str(message_id)[:100]!r} cannot be published: {exc}") from None
        # By key, so two tasks writing the same keys take index locks in the same order;
        # within a key the DataFrame's order stands (the order its messages are consumed in).
        result.sort(key=lambda row: (row.topic, row.key))
        return result

    def _check_topic(self, conn: Connection, topic: Any) -> None:
        if topic in self.counts:
            return
        if not isinstance(topic, str):
            raise InvalidMessage("topic is null")
        validate_topic(topic)
        try:
            self.counts[topic] = _ensure_topic(self.plan.options, topic)
        except SparkOptionError as exc:
            raise InvalidMessage(str(exc)) from None

    def _chunks(self, rows: list[NewRow]) -> Iterator[list[NewRow]]:
        limit = self.plan.options.batch_size
        chunk: list[NewRow] = []
        size = 0
        for row in rows:
            row_size = (len(row.payload_json) + len(row.headers_json)
                        + 4 * (len(row.key) + len(row.id)) + ROW_OVERHEAD_BYTES)
            if chunk and (len(chunk) >= limit or size + row_size > PUBLISH_BATCH_BYTES):
                yield chunk
                chunk, size = [], 0
            chunk.append(row)
            size += row_size
        if chunk:
            yield chunk

    def _insert(self, conn: Connection, rows: list[NewRow]) -> int:
        for attempt in range(1, INSERT_ATTEMPTS + 1):
            try:
                with conn.atomic():
                    return message_store.insert_rows(conn, rows)
            except InvalidMessage:
                raise
            except Exception as exc:
                if attempt == INSERT_ATTEMPTS or isinstance(exc, SQLQueueError):
                    raise
                logger.warning("spark write retried attempt=%s error=%s: %s", attempt,
                               type(exc).__name__,
                               self.plan.options.hide(" ".join(str(exc).split()))[:200])
                time.sleep(0.2 * attempt)
        return 0  # not reached


def _json(field: str, text: Any) -> Any:
    # Measured before decoding: json.loads recurses, and would fail with RecursionError
    # (or decode what publish() refuses) on text nested too deeply.
    depth = too_deep(text) if isinstance(text, str | bytes) else None
    if depth is not None:
        raise InvalidMessage(depth_error(f"{field} JSON text is", depth))
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidMessage(f"{field} is not valid JSON text: {exc}") from None


def _derived_id(values: list[Any]) -> str:
    """A stable id from the ``idColumns`` values: the SHA-256 of their JSON, in hex."""
    text = json.dumps(values, default=str, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class SqlQueueWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _TaskWriter(self.plan).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        # A failed task hands None: its rows are partly written, and its retry (or a rerun)
        # skips them.
        done = [m for m in messages if isinstance(m, Written)]
        logger.info("spark write committed rows=%s inserted=%s tasks=%s",
                    sum(m.rows for m in done), sum(m.inserted for m in done), len(done))


class SqlQueueStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return _TaskWriter(self.plan).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        done = [m for m in messages if isinstance(m, Written)]
        logger.info("spark stream write committed batch=%s rows=%s inserted=%s", batchId,
                    sum(m.rows for m in done), sum(m.inserted for m in done))
