"""A database restart (restart): two workers consume a topic published at a fixed rate (the
recovery run's topic, handler and rate, one ``publish()`` per transaction); the database
server is stopped (a fast shutdown) for ``--restart-down`` seconds (30 by default) and
started again, while the publisher keeps trying at the rate, as an application would.

From the handlers' own records (first run of each message):

- ``restart_before``: messages/s in the 20 s before the stop;
- ``restart_recovered``: messages/s in the 10 s window ending 30 s after the server
  answered again, as a fraction of ``restart_before`` (target >= 0.9);
- ``restart_minute_after``: messages/s over the minute after the server answered again, as
  a fraction of ``restart_before``;
- ``restart_first_handled``: seconds from the server answering to the first handler start.

It restarts exactly the server the benchmark is connected to (``tests/chaos/server.py``:
MariaDB/MySQL by ``SHUTDOWN`` and its own command line, PostgreSQL by ``pg_ctlcluster stop
-m fast``): run it only against a server nothing else is using. SQLite has no server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from django.db import DatabaseError, connection

from . import suite
from .recovery import NAMES, TOPIC, Publisher, _runs
from .suite import Context, Result

BEFORE = 20.0  # seconds of steady publishing measured before the stop
AFTER = 60.0  # seconds of publishing after the server answers again
RECOVERED_BY = 30.0  # seconds after which throughput must be back
WINDOW = 10.0  # seconds of the window that ends RECOVERED_BY after the server is back
SETTLE = 20.0  # seconds for the workers to take the partitions before measuring
TARGET = 0.9
DRAIN_TIMEOUT = 120.0


def restart(ctx: Context) -> list[Result]:
    if ctx.vendor == "sqlite":
        return [Result("restart_recovered", None, "of before",
                       details={"skipped": "SQLite has no server to restart"})]
    from tests.chaos.server import Server

    server = Server()
    if server.unavailable:
        return [Result("restart_recovered", None, "of before",
                       details={"skipped": server.unavailable})]
    ctx.empty_queue()
    runs_dir = ctx.work_dir / "restart"
    runs_dir.mkdir(exist_ok=True)
    env = {"SQLQUEUE_BENCH_RECOVERY_DIR": str(runs_dir)}
    publisher = Publisher(ctx.recovery_rate)
    failed = [0]
    for name in NAMES:
        suite.start_worker(ctx, TOPIC, f"restart-{name}", env, ["--name", name])
    try:
        _publish_for(ctx, publisher, SETTLE, failed)
        measured_from = time.time()
        _publish_for(ctx, publisher, BEFORE, failed)
        stopped_at = time.time()
        connection.close()
        server.stop()
        ctx.log(f"  restart: server stopped after {len(publisher.times)} messages")
        _publish_for(ctx, publisher, ctx.restart_down, failed)
        server.start()
        server.wait_until_up()
        up_at = time.time()
        ctx.log(f"  restart: server answering after {up_at - stopped_at:.1f} s")
        _publish_for(ctx, publisher, AFTER, failed)
        _, drained = suite.wait_all_acked(ctx, TOPIC, len(publisher.times), DRAIN_TIMEOUT,
                                          interval=0.2)
        if drained is None:
            raise RuntimeError(f"restart: the {len(publisher.times)} messages were not acked "
                               f"within {DRAIN_TIMEOUT:g} s")
    finally:
        suite.stop_workers(ctx)
    starts = sorted({offset: start for _, offset, _, start, _, _ in
                     sorted(_runs(runs_dir), key=lambda r: -r[3])}.values())

    def rate(begin: float, end: float) -> float:
        return sum(1 for t in starts if begin <= t < end) / (end - begin)

    before = rate(measured_from, stopped_at)
    recovered = rate(up_at + RECOVERED_BY - WINDOW, up_at + RECOVERED_BY)
    minute = rate(up_at, up_at + AFTER)
    first = next((t - up_at for t in starts if t >= up_at), None)
    windows = [round(rate(up_at + i * 5, up_at + (i + 1) * 5), 1) for i in range(int(AFTER // 5))]
    figures = {"rate_per_s": ctx.recovery_rate, "down_s": round(up_at - stopped_at, 1),
               "before_per_s": round(before, 1), "recovered_per_s": round(recovered, 1),
               "minute_after_per_s": round(minute, 1),
               "after_by_5s_per_s": windows, "publish_failures": failed[0],
               "published": len(publisher.times)}
    ctx.log(f"  restart: {json.dumps(figures)}")
    share = round(recovered / before, 3) if before else None
    return [
        Result("restart_before", round(before, 1), "msg/s", details=figures),
        Result("restart_recovered", share, "of before", target=f">= {TARGET:g}",
               met=share is not None and share >= TARGET, details=figures),
        Result("restart_minute_after", round(minute / before, 3) if before else None,
               "of before"),
        Result("restart_first_handled", round(first, 2) if first is not None else None, "s"),
    ]


def _publish_for(ctx: Context, publisher: Publisher, seconds: float, failed: list[int]) -> None:
    """Publish at the rate for ``seconds``; a publish the database refuses (it is down) is
    counted and tried again at the next tick, as an application's retry would."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            publisher.tick()
        except DatabaseError:
            failed[0] += 1
            connection.close()
            time.sleep(0.1)
        suite.check_workers_alive(ctx)
        time.sleep(0.005)


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {"restart": restart}
