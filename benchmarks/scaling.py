"""The benchmarks about scale: many keys, a million keys, and a fleet of workers.

``many_keys``  the same 20,000 messages over 16 keys and over 20,000 distinct keys,
               2 workers, each next to the raw SKIP LOCKED baseline.
``scale``      1,000,000 messages over 1,000,000 keys drained by 4 workers; the lease
               rows a group has afterwards, and what the idle workers cost.
``fleet``      8, 16 and 32 workers on one topic of 1,024 partitions: how long until
               every worker holds its fair share, whether a partition was ever handled
               by two workers at once, and what each worker costs the database.
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

import django_sqlqueue as sqlqueue

from . import suite
from .suite import Context, Result, at_most, ratio_result

MANY_KEYS_FEW = 16
MANY_KEYS_RATIO = 0.8  # many-keys rate / few-keys rate
MANY_KEYS_ROUNDS = 2
SCALE_WORKERS = 4
SCALE_PARTITIONS = 16  # the library default, which the bench topic uses
IDLE_LIMIT = 20.0  # statements per second per idle worker
FLEET_TOPIC = "fleet"
FLEET_PARTITIONS = 1024  # benchmarks/settings.py configures the topic with this many
FLEET_CONVERGE_LIMIT = 30.0  # seconds
FLEET_RATE = 200.0  # messages per second published while the fleet converges


# ---------------------------------------------------------------------------- many_keys


def many_keys(ctx: Context) -> list[Result]:
    """20,000 messages over 16 keys vs over 20,000 keys; 2 workers, no-op handler.

    Each round measures the baseline, then 16 keys, then 20,000 keys, so load from
    outside the benchmark hits all three alike.
    """
    total = ctx.e2e_messages
    variants = {"few": lambda i: f"k{i % MANY_KEYS_FEW}", "many": lambda i: f"c{i}"}
    seconds: dict[str, float] = defaultdict(float)
    rounds: list[dict[str, Any]] = []
    for n in range(MANY_KEYS_ROUNDS):
        ctx.log(f"  round {n + 1}: baseline, {total} jobs, 2 processes")
        base = suite.claim_baseline(ctx, total)
        seconds["baseline"] += base
        record: dict[str, Any] = {"baseline_seconds": round(base, 2)}
        for name, key in variants.items():
            keys = MANY_KEYS_FEW if name == "few" else total
            ctx.log(f"  round {n + 1}: queue, {total} messages over {keys} keys, 2 workers")
            ctx.empty_queue()
            suite.publish_in_batches("bench", total, key)
            outcome = suite.drain_round(ctx, "bench", total,
                                        [f"keys-{name}-r{n + 1}-{w}" for w in (1, 2)])
            seconds[name] += outcome["seconds"]
            record[name] = outcome
        rounds.append(record)
    messages = total * MANY_KEYS_ROUNDS
    base_rate = messages / seconds["baseline"]
    few_rate, many_rate = messages / seconds["few"], messages / seconds["many"]
    longest = {name: max((r[name]["longest_cycle_ms"] or 0.0) for r in rounds)
               for name in variants}
    details = {"messages": messages, "rounds": rounds}
    comparison = Result("many_keys_ratio", round(many_rate / few_rate, 3), "x",
                        target=f">= {MANY_KEYS_RATIO:g}", details={
                            "what": f"rate over {total} keys / rate over {MANY_KEYS_FEW} keys"})
    comparison.met = comparison.value is not None and comparison.value >= MANY_KEYS_RATIO
    return [
        ratio_result(f"many_keys_{MANY_KEYS_FEW}", few_rate, base_rate, "msg/s", 0.5,
                     {"keys": MANY_KEYS_FEW, **details}),
        ratio_result(f"many_keys_{total}", many_rate, base_rate, "msg/s", 0.5,
                     {"keys": total}),
        comparison,
        at_most("many_keys_longest_cycle", longest["many"], "ms", None, {
            "what": f"the longest poll cycle of any worker over {total} keys",
            f"over_{MANY_KEYS_FEW}_keys_ms": longest["few"]}),
    ]


# ---------------------------------------------------------------------------- scale


def scale(ctx: Context) -> list[Result]:
    """1,000,000 one-message keys drained by 4 workers; then lease rows and idle cost."""
    total = ctx.scale_messages
    ctx.empty_queue()
    ctx.log(f"  publishing {total:,} messages over {total:,} keys")
    began = time.monotonic()
    suite.publish_in_batches("bench", total, lambda i: f"customer-{i}", lambda i: {"n": i})
    published = time.monotonic() - began
    tags = [f"scale-{n}" for n in range(1, SCALE_WORKERS + 1)]
    # GC off, so the idle window below is not hit by the pass that deletes the million
    # drained messages (idle_queries reports what a GC pass costs).
    env = {"SQLQUEUE_BENCH_SETTINGS": '{"GC_INTERVAL": 0}'}
    ctx.log(f"  draining with {SCALE_WORKERS} workers")
    launch = time.monotonic()
    for tag in tags:
        suite.start_worker(ctx, "bench", tag, {**env, **suite.statement_log(ctx, tag)})
    try:
        _, done = suite.wait_all_acked(ctx, "bench", total, timeout=ctx.scale_timeout,
                                       interval=0.5)
        if done is None:
            raise RuntimeError(f"scale: {total:,} messages not acked within "
                               f"{ctx.scale_timeout:g} s")
        drain = done - launch
        ctx.log(f"  drained in {drain:.0f}s; counting idle statements for {ctx.idle_seconds:g}s")
        time.sleep(2.0)  # the last cycles settle every partition
        idle = idle_statements(ctx, tags)
        lease_rows = count_rows("queue_partition_leases", "bench")
        offsets_rows = count_rows("queue_offsets", "bench")
        delivery_rows = count_rows("queue_delivery_state", "bench")
    finally:
        suite.stop_workers(ctx)
    longest = suite.longest_cycle_ms(ctx, tags)
    per_worker = idle["per_worker"] if idle else None
    rows = Result("scale_lease_rows", lease_rows, "rows",
                  target=f"= {SCALE_PARTITIONS} (the partitions)", details={
                      "keys": total, "offsets_rows": offsets_rows,
                      "delivery_rows_left": delivery_rows})
    rows.met = lease_rows == SCALE_PARTITIONS and offsets_rows == SCALE_PARTITIONS
    return [
        Result("scale_drain", round(total / drain), "msg/s", details={
            "messages": total, "keys": total, "workers": SCALE_WORKERS,
            "drain_seconds": round(drain, 1), "publish_seconds": round(published, 1),
            "longest_cycle_ms": longest}),
        rows,
        at_most("scale_idle_queries_per_worker", per_worker, "queries/s",
                IDLE_LIMIT if idle else None, idle or {"skipped": "MariaDB/MySQL only"}),
    ]


def count_rows(table: str, group: str) -> int:
    return int(suite.fetch_all(
        f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)} WHERE consumer_group = %s",  # noqa: S608 - names quoted, values bound
        [group])[0][0])


def idle_statements(ctx: Context, tags: list[str]) -> dict[str, Any] | None:
    """Statements per second of these workers over ``ctx.idle_seconds`` (MariaDB/MySQL)."""
    if ctx.vendor != "mysql":
        return None
    connection.close()
    first = {tag: suite.read_statements(ctx, tag, time.time()) for tag in tags}
    time.sleep(ctx.idle_seconds)
    last = {tag: suite.read_statements(ctx, tag, time.time()) for tag in tags}
    suite.check_workers_alive(ctx)
    diffs = [suite.statement_diff(first[tag], last[tag]) for tag in tags]
    rates = [d["per_second"] for d in diffs]
    merged = suite.merge_statements(diffs)
    return {"per_worker": round(max(rates), 1), "mean_per_worker": round(sum(rates) / len(rates), 1),
            "workers": len(tags), "window_s": ctx.idle_seconds, "statement_mix": merged["kinds"]}


# ---------------------------------------------------------------------------- fleet


def fleet(ctx: Context) -> list[Result]:
    """8, 16 and 32 workers on 1,024 partitions: fair share, exclusivity, cost per worker."""
    results: list[Result] = []
    for size in ctx.fleet_sizes:
        ctx.log(f"  {size} workers on {FLEET_PARTITIONS} partitions")
        results += _fleet_run(ctx, size)
    return results


def _fleet_run(ctx: Context, size: int) -> list[Result]:
    ctx.empty_queue()
    runs_dir = ctx.work_dir / f"fleet-{size}"
    runs_dir.mkdir(exist_ok=True)
    tags = [f"fleet{size}-{n:02d}" for n in range(1, size + 1)]
    env = {"SQLQUEUE_BENCH_FLEET_DIR": str(runs_dir),
           "SQLQUEUE_BENCH_SETTINGS": '{"GC_INTERVAL": 0}'}
    start = time.monotonic()
    for tag in tags:
        suite.start_worker(ctx, FLEET_TOPIC, tag, {**env, **suite.statement_log(ctx, tag)})
    published = [0]
    next_publish = [start]

    def trickle() -> None:
        """Keyless messages (they spread over all partitions), so partitions are being
        handled while they move between workers. A machine too busy to publish at
        FLEET_RATE publishes less rather than catching up without end."""
        now = time.monotonic()
        next_publish[0] = max(next_publish[0], now - 0.1)
        while next_publish[0] <= now:
            sqlqueue.publish(FLEET_TOPIC, {"n": published[0]})
            published[0] += 1
            next_publish[0] += 1 / FLEET_RATE

    try:
        registered = wait_for(lambda: live_workers() >= size, 60 + size * 2, trickle, ctx)
        if registered is None:
            raise RuntimeError(f"fleet: only {live_workers()} of {size} workers registered")
        converged = wait_for(lambda: fair(size), 120, trickle, ctx)
        if converged is None:
            raise RuntimeError(f"fleet: {size} workers did not reach fair share in 120 s: "
                               f"{sorted(lease_holders().values())}")
        ctx.log(f"  all {size} registered {registered - start:.1f}s after launch, fair share "
                f"after {converged - start:.1f}s; draining {published[0]} messages")
        _, done = suite.wait_all_acked(ctx, FLEET_TOPIC, published[0], timeout=120,
                                       interval=0.2)
        if done is None:
            raise RuntimeError(f"fleet: the {published[0]} messages were not acked within 120 s")
        time.sleep(1.0)
        idle = idle_statements(ctx, tags)
        # One worker leaves (a graceful stop): the others take its partitions over.
        leaver = ctx.workers.pop()
        left = time.monotonic()
        leaver.send_signal(signal.SIGTERM)
        rebalanced = wait_for(lambda: fair(size - 1), 120, lambda: None, ctx)
        leaver.wait(30)
        rebalance = None if rebalanced is None else rebalanced - left
        holders = lease_holders()
    finally:
        suite.stop_workers(ctx)
    overlaps, handled, duplicates = handler_overlaps(runs_dir)
    details = {
        "workers": size, "partitions": FLEET_PARTITIONS, "messages": published[0],
        "registered_after_s": round(registered - start, 1),
        "handled": handled, "handled_twice": duplicates,
        "longest_cycle_ms": suite.longest_cycle_ms(ctx, tags),
    }
    exclusive = Result(f"fleet_{size}_overlaps", overlaps, "runs", target="= 0", details={
        "what": "handler runs of one partition by two workers at the same time"})
    exclusive.met = overlaps == 0
    return [
        at_most(f"fleet_{size}_converge", round(converged - start, 1), "s",
                FLEET_CONVERGE_LIMIT, details | {"what": "launch until every worker holds "
                                                 "its fair share"}),
        at_most(f"fleet_{size}_rebalance", None if rebalance is None else round(rebalance, 1),
                "s", FLEET_CONVERGE_LIMIT, {
                    "what": f"one of {size} workers stops until the other {size - 1} hold "
                            "their fair shares",
                    "shares_after": sorted(set(holders.values()))}),
        exclusive,
        at_most(f"fleet_{size}_idle_queries_per_worker",
                idle["mean_per_worker"] if idle else None, "queries/s", None,
                idle or {"skipped": "MariaDB/MySQL only"}),
    ]


def wait_for(condition: Callable[[], bool], timeout: float, meanwhile: Callable[[], None],
             ctx: Context) -> float | None:
    """time.monotonic() when ``condition`` first held, polling every 20 ms; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meanwhile()
        if condition():
            return time.monotonic()
        suite.check_workers_alive(ctx)
        time.sleep(0.02)
    return None


def live_workers() -> int:
    return int(suite.fetch_all(
        "SELECT COUNT(*) FROM queue_subscriber_heartbeats WHERE consumer_group = 'bench' "
        "AND topic = %s AND deregistered_at = 0", [FLEET_TOPIC])[0][0])


def lease_holders() -> dict[str, int]:
    return {owner: int(n) for owner, n in suite.fetch_all(
        "SELECT leased_by, COUNT(*) FROM queue_partition_leases WHERE consumer_group = 'bench' "
        "AND topic = %s GROUP BY leased_by", [FLEET_TOPIC])}


def fair(size: int) -> bool:
    """Every partition leased, by ``size`` workers, none above its fair share.

    Fair share is the engine's cap, ``ceil(partitions / workers)``: with 1,024 partitions
    and 8, 16 or 32 workers every worker then holds exactly 1,024 / N; with 3 workers
    342 + 342 + 340 is fair too.
    """
    holders = lease_holders()
    share = -(-FLEET_PARTITIONS // size)
    return ("" not in holders and sum(holders.values()) == FLEET_PARTITIONS
            and len(holders) == size and max(holders.values()) <= share)


def handler_overlaps(runs_dir: Path) -> tuple[int, int, int]:
    """(runs overlapping a run of another worker on the same partition, runs, messages
    handled more than once), from the handler records of benchapp's ``fleet`` handler."""
    by_partition: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    offsets: dict[str, int] = defaultdict(int)
    runs = 0
    for path in runs_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            partition, offset, pid, began, ended = line.split()
            by_partition[partition].append((float(began), float(ended), pid))
            offsets[offset] += 1
            runs += 1
    overlaps = 0
    for intervals in by_partition.values():
        intervals.sort()
        latest_end, latest_pid = 0.0, ""
        for began, ended, pid in intervals:
            if began < latest_end and pid != latest_pid:
                overlaps += 1
            if ended > latest_end:
                latest_end, latest_pid = ended, pid
    return overlaps, runs, sum(1 for n in offsets.values() if n > 1)


BENCHMARKS = {"many_keys": many_keys, "scale": scale, "fleet": fleet}
