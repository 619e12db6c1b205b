"""The limits benchmark: fleet-wide ``max_running`` and ``rate`` on four workers.

* ``limits_max_running``: 600 messages of a ``max_running=3`` subscription whose handler
  sleeps 50 ms, on 4 workers. Reported: the most handlers running at once (from the
  handlers' start/end log; target 3) and the throughput against 3 handlers' worth
  (60/s; target >= 0.9), and the hand-over: from a start back to the latest end before
  it (median and 90th percentile, ms), what a freed slot costs before its next run. All
  600 are published at once, so every partition has a standing backlog: reported too, per
  partition, the longest stretch with none of its handlers started, from the first start
  of any until its own last (the slots rotate among the workers: the bound is in
  docs/consuming.md), the longest and the median of the 16.
* ``limits_rate``: a ``rate="200/s"`` subscription with more work than 30 s can take, on 4
  workers. Reported: starts per second over the 30 s from the first start (target
  190-210/s, the first second's burst included), and the most starts in any 1 s window
  (tokens taken: at most the burst plus one second's rate, 400; starts lag their tokens
  by a thread hand-over, so 5 % more is allowed).
* ``limits_unlimited``: 4,000 messages (5 ms handler) of a subscription without limits,
  drained by the same 4 workers (which also run the limited and rated subscriptions):
  alone, beside a backlog held back by ``max_running=3``, and beside one held back by
  ``rate="200/s"``, alternating, three times each. Reported: the slower of the two
  "beside" medians against the "alone" median, and the runs' spread (target: within it).
  The rated subscription's 200 runs a second are work of its own on the same 2 CPUs.
"""

from __future__ import annotations

import bisect
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import django_sqlqueue as sqlqueue

from .suite import REPO_ROOT, Context, Result, fetch_all, stop_workers

WORKERS = 4
LIMITED = 600
RATE = 200.0  # per second
RATE_SECONDS = 30.0
UNLIMITED = 4000
ROUNDS = 3
BATCH = 2000
# A run starts a moment after its token is taken (a thread picks it up): the busiest
# window of starts may exceed the bucket's bound (burst + one period) by this factor.
START_JITTER = 1.05
TIMEOUT = 300.0  # seconds


def limits(ctx: Context) -> list[Result]:
    return [_max_running(ctx), _rate(ctx), _unlimited(ctx)]


def _max_running(ctx: Context) -> Result:
    folder = _fresh(ctx, "limits-max-running")
    _start(ctx, folder, "max-running", ["limited"])
    try:
        _publish("limited", LIMITED)
        runs = _wait_for(folder / "limited.log", LIMITED)
    finally:
        stop_workers(ctx)
    if runs is None:
        return Result("limits_max_running", None, "x", target="peak 3, >= 0.9 x 60/s")
    span = max(end for _, end in runs) - min(start for start, _ in runs)
    throughput = len(runs) / span
    ideal = 3 / 0.05
    peak = _peak(runs)
    ratio = throughput / ideal
    handovers = _handovers(runs)
    waits = _longest_waits(folder / "limited.log")
    return Result("limits_max_running", round(ratio, 3), "x", target="peak 3, >= 0.9",
                  met=peak == 3 and ratio >= 0.9,
                  details={"peak": peak, "max_concurrent_ever": peak,
                           "longest_wait_s": round(max(waits.values(), default=0.0), 2),
                           "median_longest_wait_s": round(
                               statistics.median(waits.values()) if waits else 0.0, 2),
                           "longest_wait_per_partition_s": {
                               p: round(w, 2) for p, w in sorted(waits.items(), key=_number)},
                           "throughput_per_s": round(throughput, 1),
                           "handover_ms_median": round(_quantile(handovers, 0.5) * 1000, 2),
                           "handover_ms_p90": round(_quantile(handovers, 0.9) * 1000, 2),
                           "ideal_per_s": ideal, "messages": len(runs), "workers": WORKERS})


def _rate(ctx: Context) -> Result:
    folder = _fresh(ctx, "limits-rate")
    total = int(RATE * (RATE_SECONDS + 8))
    _start(ctx, folder, "rate", ["rated"])
    log = folder / "rated.log"
    try:
        _publish("rated", total)
        deadline = time.monotonic() + TIMEOUT
        starts: list[float] = []
        while time.monotonic() < deadline:
            starts = sorted(start for start, _ in _read(log))
            if starts and time.time() > starts[0] + RATE_SECONDS + 1:
                break
            time.sleep(0.5)
    finally:
        stop_workers(ctx)
    if not starts:
        return Result("limits_rate", None, "msg/s", target="190-210")
    window = [s for s in starts if s < starts[0] + RATE_SECONDS]
    per_second = len(window) / RATE_SECONDS
    steady = [s for s in window if s >= starts[0] + 1.0]
    busiest = _busiest(window, 1.0)
    return Result("limits_rate", round(per_second, 1), "msg/s", target="190-210",
                  met=190 <= per_second <= 210 and busiest <= 2 * RATE * START_JITTER,
                  details={"busiest_1s_window": busiest,
                           "after_first_second_per_s": round(len(steady) / (RATE_SECONDS - 1), 1),
                           "rate": "200/s", "workers": WORKERS})


def _unlimited(ctx: Context) -> Result:
    rates: dict[str, list[float]] = {"alone": [], "max_running": [], "rate": []}
    for round_ in range(ROUNDS):
        for beside in rates:
            folder = _fresh(ctx, f"limits-unlimited-{round_}-{beside}")
            _start(ctx, folder, f"unlimited-{round_}-{beside}", ["unlimited", "limited", "rated"])
            try:
                if beside == "max_running":
                    _publish("limited", LIMITED * 4)  # 40 s of work held back at 3 running
                elif beside == "rate":
                    _publish("rated", int(RATE * 60))  # 60 s of work held back at 200/s
                if beside != "alone":
                    time.sleep(2.0)  # the limit busy before the unlimited work arrives
                _publish("unlimited", UNLIMITED)
                runs = _wait_for(folder / "unlimited.log", UNLIMITED)
            finally:
                stop_workers(ctx)
            if runs is None:
                return Result("limits_unlimited", None, "msg/s", target="within spread")
            span = max(end for _, end in runs) - min(start for start, _ in runs)
            rates[beside].append(len(runs) / span)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    spread = max(max(values) - min(values) for values in rates.values())
    worst = min(medians["max_running"], medians["rate"])
    return Result("limits_unlimited", round(worst, 1), "msg/s",
                  baseline=round(medians["alone"], 1), target="within spread",
                  met=medians["alone"] - worst <= spread,
                  details={**{f"{name}_per_s": [round(v, 1) for v in values]
                              for name, values in rates.items()},
                           "spread_per_s": round(spread, 1), "workers": WORKERS})


# ------------------------------------------------------------------ helpers


def _fresh(ctx: Context, name: str) -> Path:
    ctx.empty_queue()
    folder = ctx.work_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    for log in folder.glob("*.log"):
        log.unlink()
    ctx.log(f"  {name}")
    return folder


def _publish(topic: str, count: int) -> None:
    for start in range(0, count, BATCH):
        sqlqueue.publish_many(topic, [{"payload": {"n": n}, "key": f"k{n}"}
                                      for n in range(start, min(count, start + BATCH))])


def _start(ctx: Context, folder: Path, tag: str, topics: list[str]) -> None:
    """``WORKERS`` workers of the bench group on ``topics``, logging runs into ``folder``;
    returns once they share every partition (the work is published after: a steady
    state, not the start-up, is measured)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env["SQLQUEUE_BENCH_LIMITS_DIR"] = str(folder)
    args = [a for topic in topics for a in ("--topic", topic)]
    for index in range(WORKERS):
        with open(ctx.work_dir / f"worker-limits-{tag}-{index}.log", "ab") as log:
            ctx.workers.append(subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
                [sys.executable, "-m", "django", "runqueueworker", "--group", "bench", *args],
                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = fetch_all(
            "SELECT topic, COUNT(DISTINCT leased_by), SUM(CASE WHEN leased_by = '' THEN 1 ELSE 0 END) "
            "FROM queue_partition_leases WHERE consumer_group = 'bench' GROUP BY topic")
        settled = {topic for topic, owners, free in rows if owners == WORKERS and not free}
        if set(topics) <= settled:
            return
        time.sleep(0.5)


def _read(log: Path) -> list[tuple[float, float]]:
    if not log.exists():
        return []
    runs = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) in (2, 3):
            runs.append((float(parts[0]), float(parts[1])))
    return runs


def _longest_waits(log: Path) -> dict[str, float]:
    """Per partition (from "start end partition" lines): the longest stretch with none of
    its runs started, from the first start of any partition until its own last start (all
    the work was published at once: until then each partition had a backlog)."""
    starts: dict[str, list[float]] = {}
    for line in log.read_text().splitlines() if log.exists() else ():
        parts = line.split()
        if len(parts) == 3:
            starts.setdefault(parts[2], []).append(float(parts[0]))
    if not starts:
        return {}
    first = min(min(times) for times in starts.values())
    waits = {}
    for partition, times in starts.items():
        points = [first, *sorted(times)]
        waits[partition] = max(b - a for a, b in zip(points, points[1:], strict=False))
    return waits


def _number(item: tuple[str, float]) -> tuple[int, str]:
    name = item[0]
    return (int(name), name) if name.isdigit() else (1 << 30, name)


def _wait_for(log: Path, count: int) -> list[tuple[float, float]] | None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        runs = _read(log)
        if len(runs) >= count:
            return runs
        time.sleep(0.2)
    return None


def _peak(runs: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in runs] + [(end, -1) for _, end in runs])
    running = highest = 0
    for _, change in events:
        running += change
        highest = max(highest, running)
    return highest


def _handovers(runs: list[tuple[float, float]]) -> list[float]:
    """For each start but the first ``max_running`` (3): the time since the latest end
    before it, sorted."""
    ends = sorted(end for _, end in runs)
    gaps = []
    for start, _ in sorted(runs)[3:]:
        before = bisect.bisect_right(ends, start)
        if before:
            gaps.append(start - ends[before - 1])
    return sorted(gaps)


def _quantile(values: list[float], q: float) -> float:
    return values[int(q * (len(values) - 1))] if values else 0.0


def _busiest(starts: list[float], seconds: float) -> int:
    most, low = 0, 0
    for high, start in enumerate(starts):
        while starts[low] < start - seconds:
            low += 1
        most = max(most, high - low + 1)
    return most


BENCHMARKS = {"limits": limits}
