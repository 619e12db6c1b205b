"""Recovery after a crash (recovery): two workers consume a topic published at a fixed rate
(200 messages/s over 512 keys, 16 partitions, one ``publish()`` per transaction); one is
killed with SIGKILL and restarted under its name 60 s later.

From the handlers' own records (benchapp's ``recovery`` handler: partition, offset, pid,
start, attempt and publish time of every run) and the lease table:

- ``recovery_throughput``: messages whose first run started in the 60 s after the kill, as
  a fraction of what the rate publishes in 60 s (target >= 0.9);
- ``recovery_unserved``: the longest time any partition went without a handler start
  between the kill and the restart, while messages kept arriving in it (target <= 3 s);
- ``recovery_duplicates``: runs beyond one per message (the killed worker's messages in
  flight, run again once their visibility timeout lapses);
- ``recovery_takeover``: from the kill until the survivor holds every partition.

The same run follows with ``LIVENESS`` off, leases alone (``LEASE_DURATION`` 30 s), as the
baseline: ``recovery_lease_only_*``. Workers keep the library defaults otherwise.
"""

from __future__ import annotations

import json
import signal
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import django_sqlqueue as sqlqueue

from . import suite
from .suite import Context, Result, at_most

TOPIC = "recovery"
KEYS = 512
NAMES = ("recovery-a", "recovery-b")
PARTITIONS = 16  # the library default, which the benchmark settings keep
WARMUP = 10.0  # seconds of publishing at the rate, workers settled, before the kill
AFTER_RESTART = 10.0  # seconds of publishing after the restart
SETTLE_TIMEOUT = 60.0  # seconds for the two workers to share the partitions out
DRAIN_TIMEOUT = 120.0  # seconds after the last publish for every message to be acked
TICK = 0.005  # seconds between two looks at the clock of the publishing loop
THROUGHPUT_TARGET = 0.9
UNSERVED_LIMIT = 3.0  # seconds
TAKEOVER_LIMIT = 2.0  # seconds


def recovery(ctx: Context) -> list[Result]:
    """The crash and restart with liveness locks, then with leases alone."""
    results = _run(ctx, liveness=True, prefix="recovery")
    results += _run(ctx, liveness=False, prefix="recovery_lease_only")
    return results


class Publisher:
    """``publish()`` at ``rate`` messages/s, one per transaction, keys in turn. A machine
    too busy to keep up publishes less rather than catching up in a burst."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.times: list[float] = []  # time.time() of each publish, in order
        self._next: float | None = None

    def tick(self) -> None:
        now = time.monotonic()
        self._next = max(now - 0.1, self._next if self._next is not None else now)
        while self._next <= now:
            sqlqueue.publish(TOPIC, {"t": time.time()}, key=f"r{len(self.times) % KEYS}")
            self.times.append(time.time())
            self._next += 1 / self.rate


def holders() -> dict[str, int]:
    return {owner: int(n) for owner, n in suite.fetch_all(
        "SELECT leased_by, COUNT(*) FROM queue_partition_leases WHERE consumer_group = 'bench' "
        "AND topic = %s GROUP BY leased_by", [TOPIC])}


def advertised() -> bool:
    """Every lease carries its holder's liveness token."""
    return not suite.fetch_all(
        "SELECT 1 FROM queue_partition_leases WHERE consumer_group = 'bench' AND topic = %s "
        "AND liveness_token = ''", [TOPIC])


def _publish_until(ctx: Context, publisher: Publisher, until: Callable[[], bool],
                   timeout: float, what: str) -> float:
    """Publish at the rate until ``until()`` holds (looked at every 50 ms); return
    time.monotonic() then."""
    deadline = time.monotonic() + timeout
    next_look = 0.0
    while True:
        publisher.tick()
        now = time.monotonic()
        if now >= next_look:
            next_look = now + 0.05
            if until():
                return now
            suite.check_workers_alive(ctx)
        if now >= deadline:
            raise RuntimeError(f"recovery: {what} not within {timeout:g} s")
        time.sleep(TICK)


def _run(ctx: Context, *, liveness: bool, prefix: str) -> list[Result]:
    ctx.empty_queue()
    runs_dir = ctx.work_dir / prefix
    runs_dir.mkdir(exist_ok=True)
    env = {"SQLQUEUE_BENCH_RECOVERY_DIR": str(runs_dir),
           "SQLQUEUE_BENCH_SETTINGS": json.dumps({"LIVENESS": liveness})}
    survivor_name, victim_name = NAMES
    publisher = Publisher(ctx.recovery_rate)
    share = PARTITIONS // 2
    for name in NAMES:
        suite.start_worker(ctx, TOPIC, f"{prefix}-{name}", env, ["--name", name])
    try:
        _publish_until(ctx, publisher, lambda: holders() == dict.fromkeys(NAMES, share)
                       and (advertised() or not liveness), SETTLE_TIMEOUT,
                       "a fair share of the partitions")
        began = time.monotonic()
        _publish_until(ctx, publisher, lambda: time.monotonic() - began >= WARMUP,
                       WARMUP + 5, "the warm-up")
        victim = ctx.workers.pop()  # started last
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at, killed = time.time(), time.monotonic()
        ctx.log(f"  {prefix}: killed {victim_name} after {len(publisher.times)} messages")
        took_over = _publish_until(ctx, publisher, lambda: holders() == {survivor_name: PARTITIONS},
                                   ctx.recovery_seconds + 60, "the survivor taking every partition")
        takeover = took_over - killed
        _publish_until(ctx, publisher, lambda: time.monotonic() - killed >= ctx.recovery_seconds,
                       ctx.recovery_seconds + 5, "the minute after the kill")
        restarted_at = time.time()
        suite.start_worker(ctx, TOPIC, f"{prefix}-{victim_name}-again", env, ["--name", victim_name])
        restarted = time.monotonic()
        rebalanced = _publish_until(ctx, publisher, lambda: holders() == dict.fromkeys(NAMES, share),
                                    SETTLE_TIMEOUT, "the restarted worker's share")
        _publish_until(ctx, publisher, lambda: time.monotonic() - restarted >= AFTER_RESTART,
                       max(AFTER_RESTART, rebalanced - restarted) + 5, "the run's end")
        _, drained = suite.wait_all_acked(ctx, TOPIC, len(publisher.times), DRAIN_TIMEOUT,
                                          interval=0.2)
        if drained is None:
            raise RuntimeError(f"recovery: the {len(publisher.times)} messages were not acked "
                               f"within {DRAIN_TIMEOUT:g} s")
    finally:
        suite.stop_workers(ctx)
    figures = analyse(_runs(runs_dir), publisher.times, killed_at, restarted_at,
                      ctx.recovery_seconds, ctx.recovery_rate)
    figures.update({"liveness": liveness, "rate_per_s": ctx.recovery_rate,
                    "takeover_s": round(takeover, 2),
                    "rebalanced_after_restart_s": round(rebalanced - restarted, 2)})
    ctx.log(f"  {prefix}: {json.dumps(figures)}")
    throughput = Result(f"{prefix}_throughput", figures["throughput"], "of the rate",
                        details=figures)
    if liveness:
        throughput.target = f">= {THROUGHPUT_TARGET:g}"
        throughput.met = figures["throughput"] >= THROUGHPUT_TARGET
    return [
        throughput,
        at_most(f"{prefix}_unserved", figures["longest_unserved_s"], "s",
                UNSERVED_LIMIT if liveness else None,
                {"partition": figures["longest_unserved_partition"]}),
        Result(f"{prefix}_duplicates", figures["duplicate_runs"], "runs",
               details={"redelivered_after_s": figures["redelivered_after_s"]}),
        at_most(f"{prefix}_takeover", figures["takeover_s"], "s",
                TAKEOVER_LIMIT if liveness else None),
    ]


Run = tuple[str, int, int, float, int, float]  # partition, offset, pid, start, attempt, published


def _runs(runs_dir: Path) -> list[Run]:
    runs: list[Run] = []
    for path in runs_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:  # a line cut short by the kill is left out
                partition, offset, pid, start, attempt, published = parts
                runs.append((partition, int(offset), int(pid), float(start), int(attempt),
                             float(published)))
    return runs


def analyse(runs: list[Run], published: list[float], killed_at: float, restarted_at: float,
            seconds: float, rate: float) -> dict[str, Any]:
    """The figures of one run (times are time.time())."""
    first: dict[int, Run] = {}
    for run in sorted(runs, key=lambda r: r[3]):
        first.setdefault(run[1], run)
    window_end = killed_at + seconds
    handled = sum(1 for run in first.values() if killed_at <= run[3] < window_end)
    # The longest gap between two handler starts of a partition, from its last start
    # before the kill until the restart.
    starts: dict[str, list[float]] = defaultdict(list)
    for partition, _, _, start, _, _ in runs:
        starts[partition].append(start)
    longest, where = 0.0, ""
    for partition, times in starts.items():
        times.sort()
        before = [t for t in times if t <= killed_at][-1:]
        points = before + [t for t in times if killed_at < t <= restarted_at] + [restarted_at]
        for earlier, later in zip(points, points[1:], strict=False):
            if later - earlier > longest:
                longest, where = later - earlier, partition
    waits = sorted(run[3] - run[5] for run in first.values() if run[5] >= killed_at)
    reruns = [run for run in runs if run is not first[run[1]]]
    return {
        "throughput": round(handled / (rate * seconds), 3),
        "handled_in_window": handled,
        "published_in_window": sum(1 for t in published if killed_at <= t < window_end),
        "published": len(published), "handled": len(first),
        "longest_unserved_s": round(longest, 2), "longest_unserved_partition": where,
        "partitions_seen": len(starts),
        "duplicate_runs": len(reruns),
        "redelivered_after_s": round(max((run[3] - killed_at for run in reruns), default=0.0),
                                     1),
        "wait_after_kill_p50_s": round(statistics.median(waits), 3) if waits else None,
        "wait_after_kill_max_s": round(waits[-1], 2) if waits else None,
    }


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {"recovery": recovery}
