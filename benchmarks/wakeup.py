"""Wake-up on commit at volume (PostgreSQL): notify_volume.

1. Backlog: one worker listening on "bench" while 8 threads publish() in autocommit for
   ``--notify-seconds``; every second, the worker listener's unread notifications (its
   socket's Recv-Q, from ``ss``, over the bytes of one notification) and the server's
   ``pg_notification_queue_usage()``. Then a flood of 25,000 notifications, each its own
   commit (what 25,000 publishing processes' commits send), and how soon the listener has
   read them all.
2. Publisher throughput with NOTIFY on and off, in alternating rounds, with a LISTEN
   connection draining: 8 threads of autocommit publish(), and 8 threads of 10-message
   transactions. Target: on >= 0.85 x off for both.

The idle commit -> handler latency with wake-up on is latency_notify's p50/p99.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

import django_sqlqueue as sqlqueue
from django_sqlqueue.db import notify

from . import suite
from .suite import Context, Result, at_most, make_payload, ratio_result

TOPIC = "bench"
PUBLISHERS = 8
TRANSACTION_MESSAGES = 10
ROUNDS = 3
ROUND_SECONDS = 3.0
FLOOD = 25_000
FLOOD_DRAIN_TIMEOUT = 60.0  # seconds
# One notification on the wire: 'A', length, sender pid, channel and payload C strings.
NOTE_BYTES = 1 + 4 + 4 + len(notify.CHANNEL) + 1 + len(TOPIC) + 1
SAMPLE_EVERY = 1.0  # seconds
QUEUE_KB = 8 * 1024 * 1024  # the server's notification queue holds 8 GB at most
GROWTH_SLACK_KB = 64  # eight 8 kB queue pages


def notify_volume(ctx: Context) -> list[Result]:
    if ctx.vendor != "postgresql":
        ctx.log("  skipped: wake-up on commit is PostgreSQL's LISTEN/NOTIFY")
        return [Result("notify_listener_backlog_max", None, "notifications",
                       details={"skipped": "PostgreSQL only"})]
    ctx.empty_queue()
    suite.start_worker(ctx, TOPIC, "notify-volume", {"SQLQUEUE_BENCH_SETTINGS":
                                                     '{"NOTIFY": true}'})
    try:
        port = _wait_listener(ctx)
        time.sleep(1.0)
        backlog = _backlog(ctx, port)
        flood = _flood(ctx, port)
    finally:
        suite.stop_workers(ctx)
    usage = backlog.pop("usage")
    results = [
        at_most("notify_listener_backlog_max", backlog["backlog_max"], "notifications", 100,
                backlog),
        # Cluster-wide: other databases' notifications count too, so a few pages of slack.
        at_most("notify_queue_growth", round((usage[-1] - usage[0]) * QUEUE_KB, 1), "kB",
                GROWTH_SLACK_KB, {"usage_first": usage[0], "usage_max": max(usage),
                                  "usage_last": usage[-1], "samples": len(usage)}),
        at_most("notify_flood_read_s", flood["read_s"], "s", None, flood),
    ]
    results += _throughput(ctx)
    return results


# ---------------------------------------------------------------------------- backlog


def _backlog(ctx: Context, port: int) -> dict[str, Any]:
    """8 publisher threads for ctx.notify_seconds; the listener's backlog sampled."""
    counter = _Listening()
    stop = threading.Event()
    published = [0] * PUBLISHERS

    def publish(index: int) -> None:
        n = 0
        while not stop.is_set():
            sqlqueue.publish(TOPIC, make_payload(n), key=f"k{index}-{n % 16}")
            n += 1
            published[index] = n

    threads = [threading.Thread(target=_closing(publish), args=(i,)) for i in range(PUBLISHERS)]
    began = time.monotonic()
    usage, backlog = [_usage()], []
    for thread in threads:
        thread.start()
    try:
        while time.monotonic() - began < ctx.notify_seconds:
            time.sleep(SAMPLE_EVERY)
            suite.check_workers_alive(ctx)
            backlog.append(_unread(port))
            usage.append(_usage())
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        counter.stop()
    seconds = time.monotonic() - began
    commits = sum(published)
    known = [b for b in backlog if b is not None]
    return {
        "seconds": round(seconds, 1), "publishers": PUBLISHERS,
        "published_per_s": round(commits / seconds, 1),
        "notifications_per_s": round(counter.received / seconds, 1),
        "notifications_per_commit": round(counter.received / max(1, commits), 3),
        "backlog_max": max(known) if known else None,
        "backlog_last": known[-1] if known else None,
        "usage": usage,
    }


def _flood(ctx: Context, port: int) -> dict[str, Any]:
    """FLOOD notifications, each committed on its own; until the listener read them."""
    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(f"DO $$ BEGIN FOR i IN 1..{FLOOD} LOOP "  # noqa: S608 - constants
                       f"PERFORM pg_notify('{notify.CHANNEL}', '{TOPIC}'); COMMIT; END LOOP; "
                       "END $$")
    sent = time.monotonic() - began
    peak = _unread(port) or 0
    while time.monotonic() - began < FLOOD_DRAIN_TIMEOUT:
        unread = _unread(port)
        peak = max(peak, unread or 0)
        if unread is not None and unread < 100:
            break
        suite.check_workers_alive(ctx)
        time.sleep(0.1)
    read = time.monotonic() - began
    return {"notifications": FLOOD, "sent_s": round(sent, 2),
            "sent_per_s": round(FLOOD / sent), "backlog_peak_after_send": peak,
            "read_s": round(read, 2) if read < FLOOD_DRAIN_TIMEOUT else None,
            "backlog_after": _unread(port), "usage_after": _usage()}


# ---------------------------------------------------------------------------- throughput


def _throughput(ctx: Context) -> list[Result]:
    counter = _Listening()  # a listener keeping up, as workers' would
    try:
        results = []
        for shape, publish in (("autocommit", _publish_one), ("transactions10", _publish_ten)):
            on, off = [], []
            for _ in range(ROUNDS):
                for flag, runs in ((True, on), (False, off)):
                    ctx.empty_queue()
                    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "NOTIFY": flag}):
                        runs.append(_rate(publish))
            details = {"notify_on_msg_s": on, "notify_off_msg_s": off,
                       "publishers": PUBLISHERS}
            ctx.log(f"  {shape}: NOTIFY on {on} msg/s, off {off} msg/s")
            results.append(ratio_result(f"notify_publishers_{shape}",
                                        round(statistics.median(on), 1),
                                        round(statistics.median(off), 1), "msg/s", 0.85,
                                        details))
        return results
    finally:
        counter.stop()


def _publish_one(index: int, n: int) -> int:
    sqlqueue.publish(TOPIC, make_payload(n), key=f"k{index}-{n % 16}")
    return 1


def _publish_ten(index: int, n: int) -> int:
    with transaction.atomic():
        for i in range(TRANSACTION_MESSAGES):
            sqlqueue.publish(TOPIC, make_payload(n + i), key=f"k{index}-{(n + i) % 16}")
    return TRANSACTION_MESSAGES


def _rate(publish: Callable[[int, int], int]) -> float:
    """Messages per second of PUBLISHERS threads publishing for ROUND_SECONDS."""
    counts = [0] * PUBLISHERS
    start = time.perf_counter()
    deadline = start + ROUND_SECONDS

    def run(index: int) -> None:
        while time.perf_counter() < deadline:
            counts[index] += publish(index, counts[index])

    threads = [threading.Thread(target=_closing(run), args=(i,)) for i in range(PUBLISHERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(sum(counts) / (time.perf_counter() - start), 1)


# ---------------------------------------------------------------------------- observing


class _Listening:
    """A LISTEN connection of this process, draining and counting in a thread."""

    def __init__(self) -> None:
        self.received = 0
        self._stop = threading.Event()
        self._conn = notify.listener_connection("default", "sqlqueue bench listener")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in self._conn.notifies(timeout=0.2):
                self.received += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._conn.close()


def _wait_listener(ctx: Context, timeout: float = 60.0) -> int:
    """The client port of the worker's listener connection, once it is open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = suite.fetch_all(
            "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'sqlqueue listener %%'")
        if rows:
            return int(rows[0][0])
        suite.check_workers_alive(ctx)
        time.sleep(0.2)
    raise RuntimeError("notify_volume: the worker's listener did not connect")


def _unread(port: int) -> int | None:
    """Notifications waiting unread in the listener's socket (Recv-Q), None without ss."""
    try:
        out = subprocess.run(  # noqa: S603 - fixed arguments
            ["ss", "-tnH", "state", "established", f"( sport = :{port} )"],  # noqa: S607
            capture_output=True, text=True, check=False).stdout.split()
    except OSError:
        return None
    return int(out[0]) // NOTE_BYTES if out else None


def _usage() -> float:
    return float(suite.fetch_all("SELECT pg_notification_queue_usage()")[0][0])


def _closing(target: Callable[[int], None]) -> Callable[[int], None]:
    def run(index: int) -> None:
        try:
            target(index)
        finally:
            connection.close()
    return run


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {"notify_volume": notify_volume}
