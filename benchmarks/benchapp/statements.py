"""Count the statements a worker process sends to MariaDB/MySQL, by kind and table.

Enabled in a worker by ``SQLQUEUE_BENCH_STATEMENT_LOG=<path>`` (see apps.py). The
global ``Questions`` counter of the server counts every client, so the idle benchmark
counts on the client instead: every round trip mysqlclient makes that the server
counts as a statement (``Connection.query``, ``commit``, ``rollback`` and a change of
``autocommit``) is counted with the time it took, and a daemon thread writes a
snapshot (JSON, replaced atomically) to the file every 0.2 s.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import defaultdict
from typing import Any

SNAPSHOT_INTERVAL = 0.2  # seconds

_lock = threading.Lock()
_counts: dict[str, int] = defaultdict(int)
_seconds: dict[str, float] = defaultdict(float)
_TABLE = re.compile(rb"\b(?:FROM|INTO|UPDATE)\s+`?(\w+)", re.IGNORECASE)


# Telling apart the SELECTs on queue_messages, by a clause only one of them has.
_HINTS = (
    (b"invisible_until` <=", "deliverable"),
    (b"LEFT JOIN", "walk"),
    (b"GROUP BY", "new since"),
    (b"IS NULL", "unsequenced"),
)


def signature(sql: bytes) -> str:
    """``SELECT queue_messages``, ``UPDATE queue_offsets``, ``SET``, ... for a statement."""
    text = sql.lstrip()
    verb = text.split(None, 1)[0].upper().decode("ascii", "replace") if text else "?"
    match = _TABLE.search(text[:400])
    if not match:
        return verb
    kind = f"{verb} {match.group(1).decode()}"
    if kind == "SELECT queue_messages":
        hint = next((label for clause, label in _HINTS if clause in text), None)
        if hint:
            kind += f" ({hint})"
    if b" UNION ALL " in text:
        kind += " [union]"
    return kind


def _count(kind: str, started: float) -> None:
    elapsed = time.perf_counter() - started
    with _lock:
        _counts[kind] += 1
        _seconds[kind] += elapsed


def snapshot() -> dict[str, Any]:
    with _lock:
        return {"at": time.time(), "total": sum(_counts.values()), "counts": dict(_counts),
                "seconds": {k: round(v, 6) for k, v in _seconds.items()}}


def install(path: str) -> None:
    import MySQLdb.connections
    from MySQLdb import _mysql

    base = _mysql.connection
    cls = MySQLdb.connections.Connection

    def query(self: Any, sql: Any) -> Any:
        if isinstance(sql, bytearray | str):
            sql = bytes(sql, "utf-8") if isinstance(sql, str) else bytes(sql)
        started = time.perf_counter()
        try:
            return base.query(self, sql)
        finally:
            _count(signature(sql), started)

    def commit(self: Any) -> Any:
        started = time.perf_counter()
        try:
            return base.commit(self)
        finally:
            _count("COMMIT", started)

    def rollback(self: Any) -> Any:
        started = time.perf_counter()
        try:
            return base.rollback(self)
        finally:
            _count("ROLLBACK", started)

    def autocommit(self: Any, on: Any) -> None:
        on = bool(on)
        if self.get_autocommit() != on:
            started = time.perf_counter()
            try:
                base.autocommit(self, on)
            finally:
                _count("SET autocommit", started)

    cls.query = query
    cls.commit = commit
    cls.rollback = rollback
    cls.autocommit = autocommit

    def write_forever() -> None:
        tmp = f"{path}.tmp"
        while True:
            with open(tmp, "w") as f:
                json.dump(snapshot(), f)
            os.replace(tmp, path)
            time.sleep(SNAPSHOT_INTERVAL)

    threading.Thread(target=write_forever, name="bench-statements", daemon=True).start()
