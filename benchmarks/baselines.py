"""The baselines: the same work done with plain SQL on a raw driver connection.

They run against the same database and, for publishing, the same ``queue_messages``
table as the queue itself, so the ratios in the results compare like with like. The
claim loop runs in child processes (``multiprocessing``, spawn), so it lives in this
importable module rather than in run.py.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .database import Raw

# The columns publish() writes, with the same values: server-clock times, no delay.
_INSERT_COLUMNS = (
    "topic", "partition_key", "id", "payload", "metadata",
    "failed_at", "failure_count", "last_error", "original_topic", "original_offset",
    "consumer_group", "created_at", "published_at", "deliver_at",
)
_NOW_MS = {
    "mysql": "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)",
    "postgresql": "(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint)",
    "sqlite": "(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))",
}


def _quote(vendor: str, name: str) -> str:
    return f"`{name}`" if vendor == "mysql" else f'"{name}"'


def _json_param(vendor: str) -> str:
    return "CAST(%s AS jsonb)" if vendor == "postgresql" else "%s"


def message_insert_sql(vendor: str, rows: int) -> str:
    """A plain multi-row INSERT INTO queue_messages: no upsert, no RETURNING."""
    now = _NOW_MS[vendor]
    j = _json_param(vendor)
    row = f"(%s, %s, %s, {j}, {j}, 0, 0, '', '', 0, '', {now}, {now}, {now})"
    columns = ", ".join(_quote(vendor, c) for c in _INSERT_COLUMNS)
    return (f"INSERT INTO {_quote(vendor, 'queue_messages')} ({columns}) VALUES "  # noqa: S608 - names quoted, values bound
            + ", ".join([row] * rows))


def _message_params(topic: str, key: str, payload: Any) -> list[Any]:
    return [topic, key, uuid.uuid4().hex, json.dumps(payload, separators=(",", ":")), "{}"]


def publish_loop(
    db: Mapping[str, Any], seconds: float, batch: int, make_payload: Callable[[int], Any],
    topic: str = "bench",
) -> tuple[int, float]:
    """INSERT ``batch`` rows + COMMIT, repeatedly, for ``seconds``; (messages, elapsed)."""
    raw = Raw(db)
    try:
        sql = message_insert_sql(raw.vendor, batch)
        sent = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            params: list[Any] = []
            for i in range(sent, sent + batch):
                params += _message_params(topic, f"k{i % 16}", make_payload(i))
            raw.begin()
            raw.execute(sql, params)
            raw.commit()
            sent += batch
            now = time.perf_counter()
            if now >= deadline:
                return sent, now - start
    finally:
        raw.close()


# ---------------------------------------------------------------------------- jobs table


def fill_jobs(db: Mapping[str, Any], count: int, keys: int, make_payload: Callable[[int], Any]) -> None:
    """Empty ``bench_jobs`` and insert ``count`` pending jobs over ``keys`` partition keys."""
    raw = Raw(db)
    try:
        table = _quote(raw.vendor, "bench_jobs")
        if raw.vendor == "mysql":
            raw.execute(f"TRUNCATE TABLE {table}")
        elif raw.vendor == "postgresql":
            raw.execute(f"TRUNCATE TABLE {table} RESTART IDENTITY")
        else:
            raw.begin()
            raw.execute(f"DELETE FROM {table}")  # noqa: S608 - a fixed benchmark table
        raw.commit()
        j = _json_param(raw.vendor)
        raw.begin()
        for start in range(0, count, 500):
            ids = range(start, min(count, start + 500))
            params: list[Any] = []
            for i in ids:
                params += [f"k{i % keys}", json.dumps(make_payload(i), separators=(",", ":"))]
            raw.execute(
                f"INSERT INTO {table} (partition_key, payload, claimed_by, done) VALUES "  # noqa: S608 - a fixed benchmark table
                + ", ".join([f"(%s, {j}, NULL, 0)"] * len(ids)),
                params,
            )
        raw.commit()
    finally:
        raw.close()


def pending_jobs(db: Mapping[str, Any]) -> int:
    raw = Raw(db)
    try:
        return int(raw.execute("SELECT COUNT(*) FROM bench_jobs WHERE done = 0").fetchone()[0])
    finally:
        raw.close()


def claim_loop(db: Mapping[str, Any], name: str, batch: int, ready: Any, go: Any,
               results: Any) -> None:
    """One baseline consumer: claim ``batch`` jobs with SKIP LOCKED, mark them done, commit;
    until none are left. Connects first, then waits for ``go`` so start-up is not timed."""
    raw = Raw(db)
    lock = "" if raw.vendor == "sqlite" else " FOR UPDATE SKIP LOCKED"
    select = f"SELECT id FROM bench_jobs WHERE done = 0 ORDER BY id LIMIT {batch}{lock}"  # noqa: S608 - an int and a constant
    done = 0
    ready.set()
    go.wait()
    while True:
        raw.begin()
        ids = [row[0] for row in raw.execute(select).fetchall()]
        if not ids:
            raw.commit()
            break
        raw.execute(
            "UPDATE bench_jobs SET done = 1, claimed_by = %s WHERE id IN ("  # noqa: S608 - values bound
            + ", ".join(["%s"] * len(ids)) + ")",
            [name, *ids],
        )
        raw.commit()
        done += len(ids)
    results.put((name, done, time.time()))
    raw.close()
