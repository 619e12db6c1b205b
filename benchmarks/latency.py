"""Publish -> handler start with several workers (latency_workers), and PostgreSQL's
wake-up on commit (latency_notify).

latency_workers: for 1, 2 and 4 workers on one topic, subscribers (16 keys) and tasks
alike, messages published one per transaction at 20/s while the workers are idle
between them, then a steady 500/s (from four publishing threads). Each handler appends
``number time pid`` to a file, so the figures come with which worker handled each
message; the publish times are written next to it (``*.published``), for finding a
tail's cause in the worker logs. On PostgreSQL the workers run with ``NOTIFY`` off: this
measures polling.

latency_notify (PostgreSQL): 2 workers, wake-up on, 20 msg/s then 500/s, timed from the
commit and, as a user would time it, from just before ``publish()`` (``enqueue()``) is
called (``*_from_call_*``); then publish() throughput with ``NOTIFY`` on and off, in
alternating rounds.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.test import override_settings

import django_sqlqueue as sqlqueue

from . import suite
from .database import QUEUE_TABLES, truncate
from .suite import Context, Result, at_most, make_payload, percentile

KEYS = 16
FROM_CALL_P50_MS = 8.0  # latency_notify, publish() called -> handler start, idle, 2 workers
FROM_CALL_P99_MS = 20.0
IDLE_RATE = 20.0  # messages per second: the workers are idle between two messages
LOAD_RATE = 500.0  # messages per second: a steady load
LOAD_SECONDS = 4.0
LOAD_PUBLISHERS = 4  # threads, each committing one message at a time
WORKER_COUNTS = (1, 2, 4)
SETTLE_TIMEOUT = 60.0  # seconds for the workers to share the partitions out
DRAIN_TIMEOUT = 30.0  # seconds after the last publish for the last handler to start
NOTIFY_WORKERS = 2
PUBLISH_ROUNDS = 3
PUBLISH_SECONDS = 2.0


class _Kind:
    """What is published and how the workers are started: a subscriber or a task."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def topic(self) -> str:
        return "latency_workers" if self.name == "subscriber" else "tasks.latency"

    def worker_args(self) -> list[str]:
        if self.name == "subscriber":
            return ["--group", "bench", "--topic", "latency_workers"]
        return ["--queue", "latency"]

    def group(self) -> str:
        return "bench" if self.name == "subscriber" else "tasks"

    def publish(self, number: int, offsets: dict[int, int]) -> None:
        if self.name == "subscriber":
            stored = sqlqueue.publish("latency_workers", {"n": number},
                                      key=f"w{number % KEYS}")
            offsets[stored.offset] = number
        else:
            from .benchapp.tasks import record_latency

            record_latency.enqueue(number)


def _number(line_first: str, kind: _Kind, offsets: dict[int, int]) -> int | None:
    value = int(line_first)
    return offsets.get(value) if kind.name == "subscriber" else value


def latency_workers(ctx: Context) -> list[Result]:
    poll = _poll_interval()
    notify_off = {"NOTIFY": False} if ctx.vendor == "postgresql" else {}
    results: list[Result] = []
    for kind in (_Kind("subscriber"), _Kind("task")):
        for workers in WORKER_COUNTS:
            idle, load = _measure(ctx, kind, workers, notify_off)
            tag = f"latency_workers_{kind.name}_{workers}w"
            results += [
                at_most(f"{tag}_p50", idle["p50_ms"], "ms", round(poll * 500 + 10, 1), idle),
                at_most(f"{tag}_p99", idle["p99_ms"], "ms", round(poll * 1000 + 20, 1)),
                at_most(f"{tag}_load_p99", load["p99_ms"], "ms", round(poll * 2000, 1), load),
            ]
    return results


def latency_notify(ctx: Context) -> list[Result]:
    if ctx.vendor != "postgresql":
        ctx.log("  skipped: wake-up on commit is PostgreSQL's LISTEN/NOTIFY")
        return [Result("latency_notify_p99", None, "ms", target="<= 30 ms",
                       details={"skipped": "PostgreSQL only"})]
    results: list[Result] = []
    for kind in (_Kind("subscriber"), _Kind("task")):
        idle, load = _measure(ctx, kind, NOTIFY_WORKERS, {"NOTIFY": True})
        tag = f"latency_notify_{kind.name}_{NOTIFY_WORKERS}w"
        results += [at_most(f"{tag}_p50", idle["p50_ms"], "ms", 10, idle),
                    at_most(f"{tag}_p99", idle["p99_ms"], "ms", 30),
                    # As a user times it: from just before publish() (enqueue()) in the
                    # publishing process, not from its commit.
                    at_most(f"{tag}_from_call_p50", idle["from_call_p50_ms"], "ms",
                            FROM_CALL_P50_MS),
                    at_most(f"{tag}_from_call_p99", idle["from_call_p99_ms"], "ms",
                            FROM_CALL_P99_MS),
                    at_most(f"{tag}_load_p99", load["p99_ms"], "ms",
                            round(_poll_interval() * 2000, 1), load)]
    on, off = [], []
    for _ in range(PUBLISH_ROUNDS):
        for flag, runs in ((True, on), (False, off)):
            ctx.empty_queue()
            with override_settings(SQLQUEUE={**settings.SQLQUEUE, "NOTIFY": flag}):
                runs.append(_publish_rate(PUBLISH_SECONDS))
    details = {"notify_on_msg_s": on, "notify_off_msg_s": off,
               "spread_off_msg_s": round(max(off) - min(off), 1)}
    result = Result("latency_notify_publish", round(statistics.median(on), 1), "msg/s",
                    baseline=round(statistics.median(off), 1),
                    target="drop <= spread of the NOTIFY-off runs", details=details)
    result.met = statistics.median(off) - statistics.median(on) <= max(off) - min(off)
    results.append(result)
    return results


# ---------------------------------------------------------------------------- measuring


def _measure(ctx: Context, kind: _Kind, workers: int,
             overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    _empty(ctx)
    log_path = ctx.work_dir / f"latency-{kind.name}-{workers}.log"
    log_path.unlink(missing_ok=True)
    # One message per key first, so the partitions exist and are shared out before the
    # measurement: it sees the steady state, not lease acquisition.
    offsets: dict[int, int] = {}
    warmup = -1_000_000
    for k in range(KEYS):
        _publish(kind, warmup + k, offsets)
    env = {"SQLQUEUE_BENCH_LATENCY_LOG": str(log_path),
           "SQLQUEUE_BENCH_SETTINGS": json.dumps(overrides)}
    for n in range(workers):
        _start(ctx, kind, f"latency-{kind.name}-{workers}-{n}", env)
    try:
        _wait_for(ctx, log_path, kind, offsets, set(range(warmup, warmup + KEYS)))
        _wait_shared(ctx, kind, workers)
        time.sleep(0.5)
        count = int(ctx.latency_seconds * IDLE_RATE)
        ctx.log(f"  {kind.name}, {workers} worker(s): {count} messages at {IDLE_RATE:g}/s")
        idle = _run(ctx, kind, log_path, offsets, 0, count, IDLE_RATE)
        total = int(LOAD_SECONDS * LOAD_RATE)
        ctx.log(f"  {kind.name}, {workers} worker(s): {total} messages at {LOAD_RATE:g}/s")
        loaded = _run(ctx, kind, log_path, offsets, count, total, LOAD_RATE, LOAD_PUBLISHERS)
    finally:
        suite.stop_workers(ctx)
    load_avg = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    idle["load_avg"] = loaded["load_avg"] = " ".join(load_avg)
    return idle, loaded


def _run(ctx: Context, kind: _Kind, log_path: Path, offsets: dict[int, int], first: int,
         count: int, rate: float, publishers: int = 1) -> dict[str, Any]:
    """Publish ``count`` messages at ``rate`` per second from ``publishers`` threads (one
    commit each can be slower than the rate allows), then read when each started."""
    published: dict[int, float] = {}
    asked: dict[int, float] = {}  # just before publish() (enqueue()): what a user times
    begin = time.monotonic()

    def publish_share(index: int) -> None:
        for i in range(first + index, first + count, publishers):
            pause = begin + (i - first) / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            asked[i] = time.time()
            _publish(kind, i, offsets)
            published[i] = time.time()  # autocommit: committed on return

    if publishers == 1:
        publish_share(0)
    else:
        threads = [threading.Thread(target=_closing(publish_share), args=(n,))
                   for n in range(publishers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elapsed = time.monotonic() - begin
    seen = _wait_for(ctx, log_path, kind, offsets, set(published))
    # Kept with the worker logs, to tell a tail's cause (which worker, which poll) later.
    with log_path.with_suffix(".published").open("a") as out:
        out.writelines(f"{n} {t:.6f}\n" for n, t in published.items())
    values = sorted((seen[n][0] - t) * 1000 for n, t in published.items() if n in seen)
    from_call = sorted((seen[n][0] - t) * 1000 for n, t in asked.items() if n in seen)
    if not values:
        raise RuntimeError(f"latency_workers: no {kind.name} message reached a handler")
    by_worker: dict[int, int] = {}
    for n in published:
        if n in seen:
            by_worker[seen[n][1]] = by_worker.get(seen[n][1], 0) + 1
    return {
        "messages": count, "missing": count - len(values),
        "published_per_s": round(count / elapsed, 1),
        "p50_ms": round(percentile(values, 50), 1), "p95_ms": round(percentile(values, 95), 1),
        "p99_ms": round(percentile(values, 99), 1), "max_ms": round(values[-1], 1),
        "from_call_p50_ms": round(percentile(from_call, 50), 1),
        "from_call_p99_ms": round(percentile(from_call, 99), 1),
        "handled_per_worker": sorted(by_worker.values()),
    }


def _closing(target: Callable[[int], None]) -> Callable[[int], None]:
    """``target`` closing its thread's database connection when done."""
    def run(index: int) -> None:
        try:
            target(index)
        finally:
            connection.close()
    return run


def _publish(kind: _Kind, number: int, offsets: dict[int, int]) -> None:
    kind.publish(number, offsets)


def _read(path: Path, kind: _Kind, offsets: dict[int, int]) -> dict[int, tuple[float, int]]:
    """number -> (first handler start, its worker's pid)."""
    seen: dict[int, tuple[float, int]] = {}
    if not path.exists():
        return seen
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        number = _number(parts[0], kind, offsets)
        if number is None:
            continue
        at = float(parts[1])
        if number not in seen or at < seen[number][0]:
            seen[number] = (at, int(parts[2]))
    return seen


def _wait_for(ctx: Context, path: Path, kind: _Kind, offsets: dict[int, int],
              numbers: set[int]) -> dict[int, tuple[float, int]]:
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        seen = _read(path, kind, offsets)
        if numbers <= seen.keys() or time.monotonic() > deadline:
            return seen
        suite.check_workers_alive(ctx)
        time.sleep(0.1)


def _wait_shared(ctx: Context, kind: _Kind, workers: int) -> None:
    """Until ``workers`` distinct workers hold the topic's partitions, each its share."""
    share = -(-KEYS // workers) if kind.name == "subscriber" else None
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline:
        owners = dict(suite.fetch_all(
            "SELECT leased_by, COUNT(*) FROM queue_partition_leases WHERE topic = %s "
            "AND consumer_group = %s AND leased_by <> '' GROUP BY leased_by",
            [kind.topic, kind.group()]))
        if len(owners) == workers and (share is None or max(owners.values()) <= share):
            return
        suite.check_workers_alive(ctx)
        time.sleep(0.2)
    raise RuntimeError(f"latency: {workers} workers did not share the partitions out within "
                       f"{SETTLE_TIMEOUT:g} s")


def _start(ctx: Context, kind: _Kind, tag: str, env: dict[str, str]) -> None:
    import os
    import subprocess
    import sys

    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join(
        [str(suite.REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    full["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    full.update(env)
    log = open(ctx.work_dir / f"worker-{tag}.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-m", "django", "runqueueworker", *kind.worker_args(), "--name", tag],
        cwd=suite.REPO_ROOT, env=full, stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    ctx.workers.append(proc)


def _empty(ctx: Context) -> None:
    connection.close()
    truncate(ctx.db, (*QUEUE_TABLES, "queue_task_results"))


def _publish_rate(seconds: float) -> float:
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        sqlqueue.publish("bench", make_payload(sent), key=f"k{sent % KEYS}")
        sent += 1
    return round(sent / (time.perf_counter() - start), 1)


def _poll_interval() -> float:
    from django_sqlqueue.conf import get_settings

    return get_settings().poll_interval


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "latency_workers": latency_workers,
    "latency_notify": latency_notify,
}
