"""The waiting benchmark: due messages in a partition where many others wait.

Two probes, each on a topic with one partition and one worker:

* ``waiting_reminders``: ``--waiting`` messages delayed a day (reminders for tomorrow),
  then 200 due messages of other keys behind them. Reported: seconds from the worker's
  start until the 200 are handled, and the worker's longest poll cycle.
* ``waiting_failing_key``: strict mode (``batch_size=1``); one key fails on every attempt
  with ``--waiting`` messages of its own behind it, then 200 messages of other keys.
  Reported: the same two figures.

Each also reports the delivery rows and messages the topic holds once the 200 are done.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import django_sqlqueue as sqlqueue

from .suite import Context, Result, fetch_all, longest_cycle_ms, start_worker, stop_workers

DUE = 200  # due messages published behind the waiting ones
TIMEOUT = 300.0  # seconds
BATCH = 5000


def waiting(ctx: Context) -> list[Result]:
    results = []
    for name, topic, publish in (
        ("waiting_reminders", "waiting", _publish_reminders),
        ("waiting_failing_key", "waiting_strict", _publish_failing_key),
    ):
        ctx.empty_queue()
        ctx.log(f"  {name}: publishing {ctx.waiting_messages} waiting messages, then {DUE} due")
        publish(topic, ctx.waiting_messages)
        results.append(_measure(ctx, name, topic))
    return results


def _publish_reminders(topic: str, count: int) -> None:
    for start in range(0, count, BATCH):
        sqlqueue.publish_many(topic, [
            {"payload": {"n": n}, "key": f"reminder{n}", "delay": 86400}
            for n in range(start, min(count, start + BATCH))])
    sqlqueue.publish_many(topic, [{"payload": {"n": n}, "key": f"due{n}"} for n in range(DUE)])


def _publish_failing_key(topic: str, count: int) -> None:
    sqlqueue.publish(topic, {"fail": True}, key="stuck")
    for start in range(0, count, BATCH):
        sqlqueue.publish_many(topic, [
            {"payload": {"n": n}, "key": "stuck"}
            for n in range(start, min(count, start + BATCH))])
    sqlqueue.publish_many(topic, [{"payload": {"n": n}, "key": f"due{n}"} for n in range(DUE)])


def _measure(ctx: Context, name: str, topic: str) -> Result:
    log = ctx.work_dir / f"{name}-handled.log"
    log.unlink(missing_ok=True)
    tag = f"{name}-worker"
    launch = time.monotonic()
    start_worker(ctx, topic, tag, {"SQLQUEUE_BENCH_WAITING_LOG": str(log)})
    try:
        seconds = _wait_for_due(log, launch)
        rows = _counts(topic)
    finally:
        stop_workers(ctx)
    return Result(name, None if seconds is None else round(seconds, 2), "s", details={
        "waiting_messages": ctx.waiting_messages, "due_messages": DUE,
        "longest_cycle_ms": longest_cycle_ms(ctx, [tag]), **rows,
    })


def _wait_for_due(log: Path, launch: float) -> float | None:
    deadline = launch + TIMEOUT
    while time.monotonic() < deadline:
        if _handled_due(log) >= DUE:
            return time.monotonic() - launch
        time.sleep(0.1)
    return None


def _handled_due(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.startswith("due"))


def _counts(topic: str) -> dict[str, Any]:
    (messages,), = fetch_all("SELECT COUNT(*) FROM queue_messages WHERE topic = %s", [topic])
    (rows,), = fetch_all("SELECT COUNT(*) FROM queue_delivery_state WHERE topic = %s", [topic])
    (parked,), = fetch_all(
        "SELECT COUNT(*) FROM queue_delivery_state WHERE topic = %s AND parked > 0", [topic])
    return {"messages_left": int(messages), "delivery_rows": int(rows),
            "parked_rows": int(parked), "pid": os.getpid()}


BENCHMARKS = {"waiting": waiting}
