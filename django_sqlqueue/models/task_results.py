"""``queue_task_results``: one row per started task, what ``get_result`` reads.

Until a worker starts a task, its message in the log is all there is (``get_result`` reads
it from there). The worker writes the row inside its poll transaction: RUNNING as each
attempt is handed out, READY again after a failed attempt that will be retried,
SUCCESSFUL or FAILED at the end. Only one worker runs a task at a time (its message is
invisible to the others), so a read-modify-write under a row lock is enough to append to
the JSON lists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, models

from ..db import vendor
from ..db.exact_names import binary_collation
from .fields import ID_LENGTH

# A task queue Q is the topic ``tasks.Q``, consumed by the group ``tasks``.
TASK_TOPIC_PREFIX = "tasks."
TASK_GROUP = "tasks"
STATUS_LENGTH = 10
TASK_PATH_LENGTH = 255
QUEUE_NAME_LENGTH = 100
BACKEND_LENGTH = 100
# Results set SUCCESSFUL per statement: bounds the statement's size and the locks it holds.
SUCCESS_BATCH = 500
# Bytes of return values per statement (beyond the first): MariaDB refuses a statement over
# max_allowed_packet (16 MiB by default) by dropping the connection.
SUCCESS_BATCH_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Success:
    """A task that ended well: what its result row takes from the attempt."""

    id: str
    started_at: datetime | None  # the first attempt's start
    last_attempted_at: datetime | None  # this attempt's start
    return_value: Any = None  # None: left out (the column holds NULL already)
    size: int = 0  # bytes of the return value's JSON


class TaskResultQuerySet(models.QuerySet["TaskResultRecord"]):
    def finished_before(self, moment: datetime) -> TaskResultQuerySet:
        return self.filter(finished_at__lt=moment, status__in=("SUCCESSFUL", "FAILED"))

    def prune(self, moment: datetime, batch: int = 1000) -> int:
        """Delete finished results older than ``moment``, ``batch`` rows per statement so
        no statement holds many locks."""
        deleted = 0
        while True:
            ids = list(self.finished_before(moment).values_list("id", flat=True)[:batch])
            if not ids:
                return deleted
            deleted += self.filter(id__in=ids).delete()[0]
            if len(ids) < batch:
                return deleted


class TaskResultRecord(models.Model):
    """A task's result: status, timings, one worker id per attempt, every error."""

    id = models.CharField(primary_key=True, max_length=ID_LENGTH)
    task_path = models.CharField(max_length=TASK_PATH_LENGTH)
    backend = models.CharField(max_length=BACKEND_LENGTH)
    queue_name = models.CharField(max_length=QUEUE_NAME_LENGTH)
    priority = models.IntegerField(default=0)
    status = models.CharField(max_length=STATUS_LENGTH, default="READY")
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    run_after = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    worker_ids = models.JSONField(default=list)
    # [{"exception_class_path": ..., "traceback": ...}, ...], one per failed attempt
    errors = models.JSONField(default=list)
    return_value = models.JSONField(null=True, blank=True)

    objects = TaskResultQuerySet.as_manager()

    class Meta:
        db_table = "queue_task_results"
        verbose_name = "task result"
        verbose_name_plural = "task results"
        indexes = [models.Index(fields=["finished_at"], name="queue_task_results_finished")]

    def __str__(self) -> str:
        return f"{self.task_path}[{self.id}] {self.status}"


def mark_successful(successes: Sequence[Success], finished_at: datetime, using: str) -> None:
    """Set the results of ``successes`` SUCCESSFUL with their timings and return values,
    in one UPDATE per SUCCESS_BATCH rows.

    Written by hand because the poll cycle runs it for every task it records: Django's
    ``bulk_update`` builds the same CASE expressions as objects, which cost the worker more
    CPU than running the tasks.
    """
    connection = connections[using]
    q = connection.ops.quote_name
    fields = {f.name: f for f in TaskResultRecord._meta.concrete_fields}

    # PostgreSQL types a bound parameter in a CASE as text unless told (so does Django's
    # bulk_update, for the same reason).
    cast = connection.features.requires_casted_case_in_updates

    def then(column: str) -> str:
        return f"CAST(%s AS {fields[column].db_type(connection)})" if cast else "%s"

    def value(column: str, python: Any) -> Any:
        return fields[column].get_db_prep_save(python, connection)

    if connection.vendor == "postgresql":
        _mark_successful_as_json(connection, successes, finished_at)
        return
    if vendor.has_json_table(connection):
        _mark_successful_json_table(connection, successes, value("finished_at", finished_at),
                                    lambda moment: value("started_at", moment))
        return
    for batch in _batches(successes):
        assignments = [f"{q('status')} = %s", f"{q('finished_at')} = %s"]
        params: list[Any] = ["SUCCESSFUL", value("finished_at", finished_at)]
        for column in ("started_at", "last_attempted_at"):
            assignments.append(f"{q(column)} = CASE {q('id')} "
                               + " ".join([f"WHEN %s THEN {then(column)}"] * len(batch)) + " END")
            for success in batch:
                params += [success.id, value(column, getattr(success, column))]
        returned = [s for s in batch if s.return_value is not None]
        if returned:
            assignments.append(f"{q('return_value')} = CASE {q('id')} "
                               + " ".join([f"WHEN %s THEN {then('return_value')}"] * len(returned))
                               + f" ELSE {q('return_value')} END")
            for success in returned:
                params += [success.id, value("return_value", success.return_value)]
        ids = [success.id for success in batch]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {q(TaskResultRecord._meta.db_table)} SET {', '.join(assignments)} "  # noqa: S608 - names quoted, values bound
                f"WHERE {q('id')} IN ({', '.join(['%s'] * len(ids))})",
                [*params, *ids],
            )


def _mark_successful_as_json(connection: Any, successes: Sequence[Success],
                             finished_at: datetime) -> None:
    """PostgreSQL: :func:`mark_successful` with each batch's values as one JSON
    parameter (see :func:`_json_records`), joined to the rows by id."""
    q = connection.ops.quote_name
    table = q(TaskResultRecord._meta.db_table)

    def moment(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    for batch in _batches(successes):
        records = json.dumps([
            {"id": s.id, "started_at": moment(s.started_at),
             "last_attempted_at": moment(s.last_attempted_at),
             "has_return": s.return_value is not None, "return_value": s.return_value}
            for s in batch])
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} t SET {q('status')} = %s, {q('finished_at')} = %s, "  # noqa: S608 - names quoted, values bound
                f"{q('started_at')} = r.started_at, {q('last_attempted_at')} = r.last_attempted_at, "
                f"{q('return_value')} = CASE WHEN r.has_return THEN r.return_value "
                f"ELSE t.{q('return_value')} END "
                f"FROM jsonb_to_recordset(%s::jsonb) AS r(id text, started_at timestamptz, "
                f"last_attempted_at timestamptz, has_return boolean, return_value jsonb) "
                f"WHERE t.{q('id')} = r.id",
                ["SUCCESSFUL", finished_at, records],
            )


def _mark_successful_json_table(connection: Any, successes: Sequence[Success], finished_at: Any,
                                adapt: Any) -> None:
    """MariaDB: :func:`mark_successful` with each batch's values as one JSON parameter
    read by ``JSON_TABLE`` (see :func:`_json_table_rows`), joined to the rows by id. The
    id column has the ids' own collation, so the join compares them exactly and reads each
    row by its key; a CASE with a branch per id was searched row by row."""
    q = connection.ops.quote_name
    table = q(TaskResultRecord._meta.db_table)
    exact = binary_collation(connection)
    for batch in _batches(successes):
        records = json.dumps([
            [s.id, adapt(s.started_at), adapt(s.last_attempted_at),
             int(s.return_value is not None),
             None if s.return_value is None else json.dumps(s.return_value)]
            for s in batch], ensure_ascii=False)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE JSON_TABLE(%s, '$[*]' COLUMNS ("  # noqa: S608 - names quoted, values bound
                f"id VARCHAR({ID_LENGTH}) CHARACTER SET utf8mb4 COLLATE {exact} PATH '$[0]', "
                f"s DATETIME(6) PATH '$[1]', l DATETIME(6) PATH '$[2]', h INT PATH '$[3]', "
                f"v LONGTEXT PATH '$[4]')) AS r "
                f"STRAIGHT_JOIN {table} t FORCE INDEX (PRIMARY) ON t.{q('id')} = r.id "
                f"SET t.{q('status')} = %s, t.{q('finished_at')} = %s, "
                f"t.{q('started_at')} = r.s, t.{q('last_attempted_at')} = r.l, "
                f"t.{q('return_value')} = CASE WHEN r.h = 1 THEN r.v "
                f"ELSE t.{q('return_value')} END",
                [records, "SUCCESSFUL", finished_at],
            )


def insert_started(rows: Sequence[TaskResultRecord], using: str,
                   skip_existing: bool = False) -> set[str]:
    """Insert the result rows of first attempts, one multi-row INSERT per SUCCESS_BATCH;
    return the ids inserted. With ``skip_existing`` (only where :func:`can_skip_existing`),
    a row whose id exists is left out rather than failing the statement.

    Written by hand for the reason ``mark_successful`` is: ``bulk_create`` compiles the
    same INSERT through the ORM, which cost the worker a fifth of its CPU per task.
    """
    if not rows:
        return set()
    connection = connections[using]
    q = connection.ops.quote_name
    fields = TaskResultRecord._meta.concrete_fields
    table = q(TaskResultRecord._meta.db_table)
    columns = ", ".join(q(str(f.column)) for f in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    tail = f" ON CONFLICT ({q('id')}) DO NOTHING RETURNING {q('id')}" if skip_existing else ""
    as_json = connection.vendor == "postgresql"
    as_json_table = not skip_existing and vendor.has_json_table(connection)
    inserted: set[str] = set()
    for start in range(0, len(rows), SUCCESS_BATCH):
        batch = rows[start:start + SUCCESS_BATCH]
        if as_json:  # the batch as one parameter: see _json_records
            sql = (f"INSERT INTO {table} ({columns}) SELECT {columns} "  # noqa: S608 - names quoted, values bound
                   f"FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb){tail}")
            params = [_json_records(batch, fields, connection)]
        elif as_json_table:  # MariaDB: likewise, see _json_table_rows
            sql = f"INSERT INTO {table} ({columns}) {_json_table_select(fields)}"  # noqa: S608 - names quoted, values bound
            params = [_json_table_rows(batch, fields, connection)]
        else:
            sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * len(batch))}{tail}"  # noqa: S608 - names quoted, values bound
            params = [f.get_db_prep_save(getattr(row, f.attname), connection)
                      for row in batch for f in fields]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            if skip_existing:
                inserted.update(str(r[0]) for r in cursor.fetchall())
            else:
                inserted.update(row.id for row in batch)
    return inserted


def _json_records(rows: Sequence[TaskResultRecord], fields: Sequence[models.Field[Any, Any]],
                  connection: Any) -> str:
    """PostgreSQL: ``rows`` as one JSON array of objects, column to value, for
    ``jsonb_populate_recordset``. One parameter instead of one per column and row: psycopg
    parses a statement with more than 50 parameters afresh each time and quotes every
    value in Python, and the server parses the long text; for a batch of first attempts
    that was a fifth of the worker's CPU per task. JSON columns take their values as they
    are (the fields have no encoder of their own), timestamps their ISO 8601 text."""
    records = []
    for row in rows:
        record: dict[str, Any] = {}
        for field in fields:
            value = getattr(row, field.attname)
            column = str(field.column)
            if isinstance(field, models.JSONField):
                record[column] = value
            elif isinstance(value, datetime):
                record[column] = field.get_db_prep_save(value, connection).isoformat()
            else:
                record[column] = field.get_db_prep_save(value, connection)
        records.append(record)
    return json.dumps(records)


def _json_table_select(fields: Sequence[models.Field[Any, Any]]) -> str:
    """``SELECT`` of every column from the rows of :func:`_json_table_rows`. Text comes
    out as LONGTEXT, so the INSERT, not JSON_TABLE, judges a value too long (an error, as
    for any other statement)."""
    columns = []
    for index, field in enumerate(fields):
        kind = ("DATETIME(6)" if isinstance(field, models.DateTimeField)
                else "BIGINT" if isinstance(field, models.IntegerField) else "LONGTEXT")
        columns.append(f"c{index} {kind} PATH '$[{index}]'")
    names = ", ".join(f"r.c{index}" for index in range(len(fields)))
    return f"SELECT {names} FROM JSON_TABLE(%s, '$[*]' COLUMNS ({', '.join(columns)})) AS r"  # noqa: S608 - no value in the text


def _json_table_rows(rows: Sequence[TaskResultRecord], fields: Sequence[models.Field[Any, Any]],
                     connection: Any) -> str:
    """MariaDB: ``rows`` as one JSON array of arrays for ``JSON_TABLE``, for the reason
    of :func:`_json_records` (mysqlclient quotes each of a multi-row INSERT's thousands of
    parameters in Python, and Django adapts each value through its field). Values are
    what Django would bind, each distinct one adapted once: JSON columns their own JSON
    text, timestamps Django's text for MySQL. Characters go as themselves: JSON_TABLE
    reads a surrogate pair escape (an emoji under ``ensure_ascii``) as an empty string."""
    adapted: dict[tuple[int, Any], Any] = {}
    records = []
    for row in rows:
        record = []
        for index, field in enumerate(fields):
            value = getattr(row, field.attname)
            if isinstance(field, models.JSONField):
                record.append(None if value is None and field.null else json.dumps(value))
                continue
            key = (index, value)
            if key not in adapted:
                adapted[key] = field.get_db_prep_save(value, connection)
            record.append(adapted[key])
        records.append(record)
    return json.dumps(records, ensure_ascii=False)


def can_skip_existing(using: str) -> bool:
    """Whether :func:`insert_started` can leave out existing rows and say which it
    inserted, in the one statement (PostgreSQL and SQLite: ``ON CONFLICT DO NOTHING
    RETURNING``; MySQL's ``INSERT IGNORE`` would also turn a too-long value into a
    warning)."""
    return connections[using].vendor in ("postgresql", "sqlite")


def new_row(**values: Any) -> TaskResultRecord:
    """A new, unsaved row made without ``Model.__init__`` (the worker makes one per first
    attempt): the fields ``values`` names take them, the others their defaults."""
    row = TaskResultRecord.__new__(TaskResultRecord)
    row.__dict__.update({f.attname: values.pop(f.attname) if f.attname in values
                         else f.get_default() for f in _FIELDS})
    if values:
        raise TypeError(f"TaskResultRecord has no field {sorted(values)[0]!r}")
    row._state = models.base.ModelState()
    return row


def copy_row(row: TaskResultRecord, **changes: Any) -> TaskResultRecord:
    """A copy of ``row`` with ``changes``, made without ``Model.__init__`` (the worker
    makes several per task): the same field values, a fresh unsaved state."""
    copy = TaskResultRecord.__new__(TaskResultRecord)
    copy.__dict__.update({f.attname: row.__dict__[f.attname] for f in _FIELDS})
    copy._state = models.base.ModelState()
    for name, value in changes.items():
        setattr(copy, name, value)
    return copy


def _batches(successes: Sequence[Success]) -> list[Sequence[Success]]:
    """``successes`` in runs of at most SUCCESS_BATCH rows and SUCCESS_BATCH_BYTES of
    return values (a run holds one row at least)."""
    batches: list[Sequence[Success]] = []
    start, size = 0, 0
    for index, success in enumerate(successes):
        if index > start and (index - start >= SUCCESS_BATCH
                              or size + success.size > SUCCESS_BATCH_BYTES):
            batches.append(successes[start:index])
            start, size = index, 0
        size += success.size
    if start < len(successes):
        batches.append(successes[start:])
    return batches


def reopen_replayed_tasks(sender: object, replays: list[Any], using: str, **kwargs: Any) -> None:
    """Receiver of ``dead_letters_replayed``: a FAILED task whose dead letter is replayed
    is READY again under the same result id, its earlier errors and worker ids kept. It
    runs in the replay's transaction, so no worker can start the replay before this."""
    ids = [r.original_id for r in replays
           if r.group == TASK_GROUP and r.topic.startswith(TASK_TOPIC_PREFIX) and r.original_id]
    if ids:
        TaskResultRecord.objects.using(using).filter(id__in=ids, status="FAILED").update(
            status="READY", finished_at=None)


_FIELDS = TaskResultRecord._meta.concrete_fields
