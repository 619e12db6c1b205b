"""The tables ``manage.py sqlqueue`` prints: the overview, the limits and the schedules,
each a header and one row per item, in columns as wide as their widest cell; and the same
items as JSON, one object per line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django_sqlqueue.operations import LimitStats, ScheduleRow, SubscriptionStats

Write = Callable[[str], Any]


def write_json_lines(write: Write, objects: Sequence[dict[str, Any]]) -> None:
    """A JSON list with one object per line: what a log collector or grep reads line by
    line."""
    write("[\n" + ",\n".join(map(json.dumps, objects)) + "\n]" if objects else "[]")


def write_overview(write: Write, rows: Iterable[SubscriptionStats], *,
                   databases: bool = False) -> None:
    """The stats table; with ``databases``, a first column naming each row's alias."""
    rows = list(rows)
    header = ("TOPIC", "GROUP", "LAG", "IN FLIGHT", "DEAD", "OLDEST", "WORKERS", "PAUSED",
              "LAST MIN", "LAST HOUR")
    table: list[tuple[str, ...]] = [header]
    table += [(
        r.topic, r.group, f"{'~' if r.lag_estimated else ''}{r.lag}", str(r.in_flight),
        f"{r.dead_letters}{'+' if r.dead_letters_capped else ''}",
        "-" if r.oldest_pending_age_seconds is None else f"{r.oldest_pending_age_seconds:.0f}s",
        str(r.workers), "yes" if r.paused else "no", str(r.handled_per_minute[-1]),
        str(sum(r.handled_per_minute)),
    ) for r in rows]
    if databases:
        table = [("DATABASE", *table[0])] + [(r.database, *line)
                                             for r, line in zip(rows, table[1:], strict=True)]
    _write_table(write, table)


def write_limits(write: Write, rows: Iterable[LimitStats]) -> None:
    header = ("SCOPE", "RUNNING", "RATE", "TOKENS", "PER KEY", "KEYS RUNNING")
    _write_table(write, [header] + [(
        r.scope,
        "-" if r.max_running is None else f"{r.running}/{r.max_running}",
        r.rate or "-",
        "-" if r.tokens is None else f"{r.tokens:g}",
        ", ".join([*([f"{r.max_running_per_key} running"] if r.max_running_per_key else []),
                   *([r.rate_per_key] if r.rate_per_key else [])]) or "-",
        f"{r.keys_running} ({r.key_slots_running} slots)" if r.keys_running else "0",
    ) for r in rows])


def write_schedules(write: Write, rows: Iterable[ScheduleRow]) -> None:
    header = ("NAME", "CRON", "TIMEZONE", "TARGET", "NEXT RUN", "LAST RUN", "LAST MESSAGE",
              "PAUSED", "FROM", "WAITING BECAUSE")
    _write_table(write, [header] + [(
        r.name, r.cron, r.timezone, r.target, _when(r.next_run_at), _when(r.last_run_at),
        r.last_message or "-", "yes" if r.paused else "no", r.origin, r.reason or "-",
    ) for r in rows])


def _write_table(write: Write, table: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")
