"""The benchmarks. Each takes a Context and returns Results; run.py orders and prints them.

All figures come from one run against one database: each queue measurement has its
baseline measured right next to it, on an emptied table.
"""

from __future__ import annotations

import inspect
import json
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection

import django_sqlqueue as sqlqueue

from . import baselines
from .database import Raw, global_status, truncate

REPO_ROOT = Path(__file__).resolve().parent.parent

E2E_KEYS = 16
LATENCY_KEYS = 4
LATENCY_RATE = 20.0  # messages per second
IDLE_KEYS = 1000
IDLE_DRAIN_TIMEOUT = 150  # seconds
MANY_BATCH = 500
CLAIM_BATCH = 10
E2E_ROUNDS = 2
LONGEST_CYCLE = re.compile(r"worker stopped .*longest_cycle_ms=(\d+)")


# ---------------------------------------------------------------------------- results


@dataclass
class Result:
    name: str
    value: float | None
    unit: str
    baseline: float | None = None
    target: str = ""  # e.g. "ratio >= 0.8", "<= 60 ms"; "" = informational
    met: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "value": self.value, "unit": self.unit,
            "baseline": self.baseline, "ratio": self.ratio, "target": self.target or None,
            "met": self.met, "details": self.details,
        }


def ratio_result(name: str, value: float, baseline: float, unit: str, minimum: float,
                 details: dict[str, Any]) -> Result:
    result = Result(name, value, unit, baseline, f"ratio >= {minimum:g}", details=details)
    result.met = result.ratio is not None and result.ratio >= minimum
    return result


def at_most(name: str, value: float | None, unit: str, limit: float | None,
            details: dict[str, Any] | None = None) -> Result:
    result = Result(name, value, unit, details=details or {})
    if limit is not None:
        result.target = f"<= {limit:g} {unit}"
        result.met = value is not None and value <= limit
    return result


@dataclass
class Context:
    db: dict[str, Any]
    vendor: str
    seconds: float
    work_dir: Path
    e2e_messages: int = 20_000
    latency_seconds: float = 15.0
    idle_seconds: float = 10.0
    profile: bool = False  # count the end_to_end workers' statements (MariaDB/MySQL)
    scale_messages: int = 1_000_000
    scale_timeout: float = 1800.0
    fleet_sizes: tuple[int, ...] = (8, 16, 32)
    admin_messages: int = 1_000_000
    admin_dead_letters: int = 100_000
    task_count: int = 5_000  # tasks enqueued and drained on django-sqlqueue's backend
    baseline_task_count: int = 1_000  # ... and on django-tasks-db's
    waiting_messages: int = 50_000  # waiting messages in one partition (waiting benchmark)
    schedule_count: int = 10_000  # run-time schedules stored (schedules benchmark)
    schedule_seconds: float = 30.0  # how long 300 of them fire
    notify_seconds: float = 120.0  # notify_volume: how long 8 threads publish
    recovery_rate: float = 200.0  # recovery: messages published per second
    recovery_seconds: float = 60.0  # recovery: from the kill to the restart
    restart_down: float = 30.0  # restart: seconds the database server stays stopped
    scaleout_messages: int = 20_000  # scaleout: messages per topic per round
    baseline_library: str | None = None  # throughput: an earlier checkout to compare with
    throughput_messages: int = 20_000  # throughput: messages (and tasks) per drain
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    log: Callable[[str], None] = print

    def empty_queue(self) -> None:
        connection.close()  # TRUNCATE waits for metadata locks our own session may hold
        truncate(self.db)


# ---------------------------------------------------------------------------- helpers


def make_payload(i: int) -> dict[str, Any]:
    """A ~200-byte JSON object, a little different every time."""
    return {
        "order_id": 100_000 + i,
        "customer": f"customer-{i % 977:04d}",
        "currency": "EUR",
        "total": f"{(i % 5000) / 7:.2f}",
        "items": [{"sku": f"SKU-{i % 89:04d}", "qty": 1 + i % 3},
                  {"sku": f"SKU-{i % 53:04d}", "qty": 2}],
        "note": "benchmark payload, padded to about two hundred bytes",
    }


def fetch_all(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def session_questions() -> int:
    """Statements this process's Django connection has sent (MariaDB/MySQL only)."""
    return int(fetch_all("SHOW SESSION STATUS LIKE 'Questions'")[0][1])


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def start_worker(ctx: Context, topic: str, tag: str,
                 extra_env: dict[str, str] | None = None,
                 args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """``manage.py runqueueworker --group bench --topic <topic> <args>`` in a child
    process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env.update(extra_env or {})
    log = open(ctx.work_dir / f"worker-{tag}.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-m", "django", "runqueueworker", "--group", "bench", "--topic", topic,
         *args],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    log.close()
    ctx.workers.append(proc)
    return proc


def stop_workers(ctx: Context, timeout: float = 15.0) -> None:
    """SIGTERM our workers (a graceful stop), SIGKILL any still running after ``timeout``."""
    for proc in ctx.workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in ctx.workers:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ctx.log(f"  worker {proc.pid} did not stop within {timeout:g}s; killing it")
            proc.kill()
            proc.wait()
    ctx.workers.clear()


def check_workers_alive(ctx: Context) -> None:
    for proc in ctx.workers:
        if proc.poll() is not None:
            raise RuntimeError(
                f"worker {proc.pid} exited with status {proc.returncode}; see its log in "
                f"{ctx.work_dir}")


def statement_log(ctx: Context, tag: str) -> dict[str, str]:
    """Worker environment enabling the statement counter (MariaDB/MySQL only)."""
    if ctx.vendor != "mysql":
        return {}
    return {"SQLQUEUE_BENCH_STATEMENT_LOG": str(ctx.work_dir / f"statements-{tag}.json")}


def read_statements(ctx: Context, tag: str, newer_than: float,
                    timeout: float = 5.0) -> dict[str, Any]:
    """The worker's statement snapshot written after ``newer_than`` (a time.time())."""
    path = ctx.work_dir / f"statements-{tag}.json"
    deadline = time.monotonic() + timeout
    while True:
        try:
            snap = json.loads(path.read_text())
            if snap["at"] > newer_than:
                return snap
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no statement snapshot from worker {tag} in {path}")
        time.sleep(0.05)


def statement_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Statements between two snapshots: total, per second, and per kind (count, ms)."""
    kinds = {}
    for kind, count in after["counts"].items():
        n = count - before["counts"].get(kind, 0)
        if n:
            ms = (after["seconds"][kind] - before["seconds"].get(kind, 0.0)) * 1000
            kinds[kind] = {"count": n, "ms": round(ms, 1)}
    total = after["total"] - before["total"]
    span = after["at"] - before["at"]
    return {"total": total, "seconds": round(span, 2), "per_second": total / span,
            "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["count"]))}


def merge_statements(diffs: list[dict[str, Any]]) -> dict[str, Any]:
    kinds: dict[str, dict[str, float]] = {}
    for diff in diffs:
        for kind, v in diff["kinds"].items():
            k = kinds.setdefault(kind, {"count": 0, "ms": 0.0})
            k["count"] += v["count"]
            k["ms"] = round(k["ms"] + v["ms"], 1)
    return {"total": sum(d["total"] for d in diffs),
            "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["count"]))}


def watermarks(topic: str) -> dict[str, int]:
    return dict(fetch_all(
        "SELECT partition_key, offset_acked FROM queue_offsets "
        "WHERE consumer_group = %s AND topic = %s", ["bench", topic]))


def last_position() -> int:
    rows = fetch_all("SELECT last_position FROM queue_sequencer")
    return int(rows[0][0]) if rows else 0


def max_positions(topic: str) -> dict[str, int]:
    return {k: int(v) for k, v in fetch_all(
        "SELECT partition_key, MAX(position) FROM queue_messages WHERE topic = %s "
        "GROUP BY partition_key", [topic])}


def wait_all_acked(ctx: Context, topic: str, total: int, timeout: float,
                   on_poll: Callable[[float], None] | None = None,
                   interval: float = 0.02) -> tuple[float | None, float | None]:
    """Wait until every message of ``topic`` is acked by group ``bench``.

    Done means: the sequencer has positioned all ``total`` messages (the queue tables
    were emptied before publishing, so positions run 1..total) and every partition's
    watermark (``queue_offsets.offset_acked``) has reached its highest position.
    Returns (time.monotonic() of the first watermark move, of completion), None on timeout.
    """
    start = time.monotonic()
    first: float | None = None
    targets: dict[str, int] | None = None
    while time.monotonic() - start < timeout:
        now = time.monotonic()
        if on_poll:
            on_poll(now)
        marks = watermarks(topic)
        if first is None and any(v > 0 for v in marks.values()):
            first = now
        if targets is None and last_position() >= total:
            targets = max_positions(topic)
        if targets is not None and all(marks.get(k, 0) >= v for k, v in targets.items()):
            return first, now
        check_workers_alive(ctx)
        time.sleep(interval)
    return first, None


# ---------------------------------------------------------------------------- publishing


def publish_single(ctx: Context) -> list[Result]:
    """publish() one message per transaction (autocommit) vs. a raw INSERT + COMMIT."""
    return _publish(ctx, "publish_single", 1, 0.8)


def publish_many(ctx: Context) -> list[Result]:
    """publish_many() of 500 messages vs. a raw 500-row INSERT + COMMIT."""
    return _publish(ctx, "publish_many", MANY_BATCH, 0.5)


def _publish(ctx: Context, name: str, batch: int, minimum: float) -> list[Result]:
    # Two alternating rounds of each, every one on an empty table, so slow drifts of the
    # server (flushing, purge) hit both sides alike.
    half = ctx.seconds / 2
    engine_n = base_n = 0
    engine_t = base_t = 0.0
    statements = 0
    for _ in range(2):
        ctx.empty_queue()
        n, t = baselines.publish_loop(ctx.db, half, batch, make_payload)
        base_n, base_t = base_n + n, base_t + t
        ctx.empty_queue()
        before = session_questions() if ctx.vendor == "mysql" else 0
        n, t = _publish_engine(half, batch)
        engine_n, engine_t = engine_n + n, engine_t + t
        if ctx.vendor == "mysql":
            statements += session_questions() - before - 1
    details: dict[str, Any] = {
        "messages": engine_n, "seconds": round(engine_t, 2),
        "baseline_messages": base_n, "baseline_seconds": round(base_t, 2),
        "batch": batch,
    }
    if ctx.vendor == "mysql":
        details["statements_per_call"] = round(statements / (engine_n / batch), 2)
        details["baseline_statements_per_call"] = 2  # INSERT, COMMIT
    return [ratio_result(name, engine_n / engine_t, base_n / base_t, "msg/s", minimum, details)]


def _publish_engine(seconds: float, batch: int) -> tuple[int, float]:
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        if batch == 1:
            sqlqueue.publish("bench", make_payload(sent), key=f"k{sent % 16}")
        else:
            sqlqueue.publish_many("bench", [
                {"payload": make_payload(i), "key": f"k{i % 16}"}
                for i in range(sent, sent + batch)
            ])
        sent += batch
        now = time.perf_counter()
        if now >= deadline:
            return sent, now - start


# ---------------------------------------------------------------------------- end to end


def end_to_end(ctx: Context) -> list[Result]:
    """20,000 waiting messages over 16 keys, two workers: launch until all acked.

    Two rounds, each the baseline then the queue, so load from outside the benchmark
    hits both sides alike; the rates are total messages over total time.
    """
    total = ctx.e2e_messages
    rounds = []
    for n in range(E2E_ROUNDS):
        ctx.log(f"  round {n + 1}: baseline, {total} jobs, 2 processes, claim {CLAIM_BATCH} "
                "per transaction")
        base_seconds = claim_baseline(ctx, total)
        ctx.log(f"  round {n + 1}: queue, {total} messages, 2 workers")
        rounds.append(_e2e_round(ctx, total, f"r{n + 1}") | {
            "baseline_seconds": round(base_seconds, 2),
            "baseline_rate": round(total / base_seconds)})
    seconds = sum(r["seconds"] for r in rounds)
    base_seconds = sum(r["baseline_seconds"] for r in rounds)
    details: dict[str, Any] = {
        "messages": total * len(rounds), "seconds": round(seconds, 2),
        "baseline_seconds": round(base_seconds, 2), "rounds": rounds,
    }
    profiles = [r.pop("statements") for r in rounds if "statements" in r]
    if profiles:
        merged = merge_statements(profiles)
        details["worker_statements_per_message"] = round(
            merged["total"] / (total * len(profiles)), 3)
        details["worker_statements"] = merged
    return [ratio_result("end_to_end", total * len(rounds) / seconds,
                         total * len(rounds) / base_seconds, "msg/s", 0.5, details)]


def _e2e_round(ctx: Context, total: int, tag: str) -> dict[str, Any]:
    ctx.empty_queue()
    publish_in_batches("bench", total, lambda i: f"k{i % E2E_KEYS}")
    return drain_round(ctx, "bench", total, [f"e2e-{tag}-1", f"e2e-{tag}-2"])


def publish_in_batches(topic: str, total: int, key: Callable[[int], str],
                       payload: Callable[[int], Any] = make_payload, batch: int = 5000) -> None:
    for start in range(0, total, batch):
        sqlqueue.publish_many(topic, [
            {"payload": payload(i), "key": key(i)}
            for i in range(start, min(total, start + batch))
        ])


def drain_round(ctx: Context, topic: str, total: int, tags: list[str], timeout: float = 120,
                extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start one worker per tag on ``topic`` and time them from launch until all ``total``
    waiting messages are acked; then stop them (their logs give the longest poll cycle)."""
    holders: dict[str, float] = {}
    launch = time.monotonic()
    launched_at = time.time()
    next_sample = [launch]

    def sample_leases(now: float) -> None:
        if now < next_sample[0]:
            return
        next_sample[0] = now + 0.25
        for (owner,) in fetch_all(
            "SELECT DISTINCT leased_by FROM queue_partition_leases WHERE consumer_group = "
            "'bench' AND topic = %s AND leased_by <> ''", [topic]
        ):
            holders.setdefault(owner, now - launch)

    for name in tags:
        env = dict(extra_env or {})
        if ctx.profile:
            env.update(statement_log(ctx, name))
        start_worker(ctx, topic, name, env)
    profile = None
    try:
        first, done = wait_all_acked(ctx, topic, total, timeout=timeout, on_poll=sample_leases)
        if done is not None and ctx.profile and ctx.vendor == "mysql":
            done_at = launched_at + (done - launch)
            empty = {"at": launched_at, "total": 0, "counts": {}, "seconds": {}}
            profile = merge_statements([
                statement_diff(empty, read_statements(ctx, name, done_at)) for name in tags])
    finally:
        stop_workers(ctx)
    if done is None:
        raise RuntimeError(f"{topic}: not all {total} messages acked within {timeout:g} s")
    elapsed = done - launch
    result: dict[str, Any] = {
        "seconds": round(elapsed, 2), "rate": round(total / elapsed),
        "first_ack_after_s": round((first or done) - launch, 2),
        # When each worker (by pid) first held a lease: one entry means the other
        # worker never got a partition before the end.
        "lease_holders": {k.rsplit(":", 1)[-1]: round(v, 2) for k, v in holders.items()},
        "deadlocks_retried": _count_in_logs(ctx, tags, "Deadlock found"),
        "longest_cycle_ms": longest_cycle_ms(ctx, tags),
    }
    if profile:
        result["statements"] = profile
    return result


def longest_cycle_ms(ctx: Context, tags: list[str]) -> float | None:
    """The longest poll cycle of these (stopped) workers, from their stop lines."""
    longest = None
    for tag in tags:
        path = ctx.work_dir / f"worker-{tag}.log"
        if path.exists():
            for match in LONGEST_CYCLE.finditer(path.read_text(errors="replace")):
                longest = max(longest or 0.0, float(match.group(1)))
    return longest


def _count_in_logs(ctx: Context, tags: list[str], needle: str) -> int:
    count = 0
    for tag in tags:
        path = ctx.work_dir / f"worker-{tag}.log"
        if path.exists():
            count += path.read_text(errors="replace").count(needle)
    return count


def claim_baseline(ctx: Context, total: int) -> float:
    baselines.fill_jobs(ctx.db, total, E2E_KEYS, make_payload)
    mp = multiprocessing.get_context("spawn")
    ready = [mp.Event(), mp.Event()]
    go = mp.Event()
    results = mp.Queue()
    procs = [
        mp.Process(target=baselines.claim_loop,
                   args=(ctx.db, f"baseline-{n}", CLAIM_BATCH, ready[n], go, results))
        for n in range(2)
    ]
    for proc in procs:
        proc.start()
    try:
        for event in ready:
            if not event.wait(60):
                raise RuntimeError("end_to_end baseline: a process did not connect in 60 s")
        start = time.time()
        go.set()
        finished = [results.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    handled = sum(n for _, n, _ in finished)
    left = baselines.pending_jobs(ctx.db)
    if handled != total or left:
        raise RuntimeError(f"end_to_end baseline: handled {handled} of {total}, {left} left")
    return max(end for _, _, end in finished) - start


# ---------------------------------------------------------------------------- latency


def latency(ctx: Context) -> list[Result]:
    """One worker, 20 msg/s for ~15 s over 4 keys; publish commit -> handler start."""
    ctx.empty_queue()
    log_path = ctx.work_dir / "latency.log"
    log_path.unlink(missing_ok=True)
    # One message per key first, so the partitions exist when the worker starts and the
    # measurement sees the steady state, not lease acquisition.
    for k in range(LATENCY_KEYS):
        sqlqueue.publish("latency", {"warmup": True}, key=f"l{k}")
    start_worker(ctx, "latency", "latency", {"SQLQUEUE_BENCH_LATENCY_LOG": str(log_path)})
    published: dict[int, float] = {}
    try:
        _, warm = wait_all_acked(ctx, "latency", LATENCY_KEYS, timeout=60)
        if warm is None:
            raise RuntimeError("latency: the warm-up messages were not acked within 60 s")
        time.sleep(0.5)
        count = int(ctx.latency_seconds * LATENCY_RATE)
        ctx.log(f"  publishing {count} messages at {LATENCY_RATE:g}/s")
        begin = time.monotonic()
        for i in range(count):
            pause = begin + i / LATENCY_RATE - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            stored = sqlqueue.publish("latency", make_payload(i), key=f"l{i % LATENCY_KEYS}")
            published[stored.offset] = time.time()  # autocommit: committed on return
        deadline = time.monotonic() + 5
        received: dict[int, float] = {}
        while time.monotonic() < deadline:
            received = _read_latency_log(log_path)
            if all(offset in received for offset in published):
                break
            check_workers_alive(ctx)
            time.sleep(0.1)
    finally:
        stop_workers(ctx)
    received = _read_latency_log(log_path)
    values = sorted((received[o] - t) * 1000 for o, t in published.items() if o in received)
    missing = len(published) - len(values)
    if not values:
        raise RuntimeError("latency: no message reached the handler")
    details = {"messages": len(published), "missing": missing,
               "min_ms": round(values[0], 1), "mean_ms": round(sum(values) / len(values), 1)}
    p50, p95, p99 = (percentile(values, p) for p in (50, 95, 99))
    return [
        at_most("latency_p50", round(p50, 1), "ms", 60, details),
        at_most("latency_p95", round(p95, 1), "ms", None),
        at_most("latency_p99", round(p99, 1), "ms", 150),
        at_most("latency_max", round(values[-1], 1), "ms", None),
    ]


def _read_latency_log(path: Path) -> dict[int, float]:
    """offset -> first handler start time."""
    seen: dict[int, float] = {}
    if not path.exists():
        return seen
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            offset, at = int(parts[0]), float(parts[1])
            seen[offset] = min(at, seen.get(offset, at))
    return seen


# ---------------------------------------------------------------------------- idle


def idle_queries(ctx: Context) -> list[Result]:
    """Statements per second of one idle worker after draining 1,000 keys (16 partitions)."""
    if ctx.vendor != "mysql":
        ctx.log("  skipped: the statement counter hooks mysqlclient (MariaDB/MySQL only)")
        return [Result("idle_queries", None, "queries/s", target="<= 20 queries/s",
                       details={"skipped": "MariaDB/MySQL only"})]
    from django_sqlqueue.conf import get_settings
    from django_sqlqueue.worker.collector import collect_garbage

    ctx.empty_queue()
    sqlqueue.publish_many("bench", [
        {"payload": make_payload(i), "key": f"i{i:04d}"} for i in range(IDLE_KEYS)])
    # GC off in the worker, so the window is not hit by the pass that runs every
    # GC_INTERVAL (60 s by default); that pass is counted on its own below.
    start_worker(ctx, "bench", "idle", {"SQLQUEUE_BENCH_SETTINGS": '{"GC_INTERVAL": 0}',
                                         **statement_log(ctx, "idle")})
    status = Raw(ctx.db)
    try:
        launch = time.monotonic()
        _, done = wait_all_acked(ctx, "bench", IDLE_KEYS, timeout=IDLE_DRAIN_TIMEOUT,
                                 interval=0.1)
        if done is None:
            raise RuntimeError(f"idle_queries: the {IDLE_KEYS} messages were not all acked "
                               f"within {IDLE_DRAIN_TIMEOUT} s")
        drain = done - launch
        time.sleep(1.0)  # let the last cycle settle every partition
        ctx.log(f"  drained {IDLE_KEYS} keys in {drain:.1f}s; counting for "
                f"{ctx.idle_seconds:g}s")
        connection.close()
        first = read_statements(ctx, "idle", time.time())
        server_before = global_status(status, ["Questions"])["Questions"]
        time.sleep(ctx.idle_seconds)
        server_after = global_status(status, ["Questions"])["Questions"]
        last = read_statements(ctx, "idle", time.time())
        others = status.execute(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
            "AND (DB IS NULL OR DB <> %s) AND COMMAND NOT IN ('Daemon', 'Binlog Dump')",
            [ctx.db["NAME"]]).fetchone()[0]
        check_workers_alive(ctx)
    finally:
        stop_workers(ctx)
        status.close()
    counted = statement_diff(first, last)
    rate = counted["per_second"]
    # Garbage collection of an idle worker, run here the way the worker runs it every
    # GC_INTERVAL: the first pass deletes the drained messages, the second is what every
    # later pass of an idle worker costs.
    gc_args: list[Any] = [["bench"], {"bench": {"bench"}}, "default"]
    if "collected" in inspect.signature(collect_garbage).parameters:
        gc_args.append({})  # the worker's memo of horizons already collected
    collect_garbage(*gc_args)
    before_gc = session_questions()
    collect_garbage(*gc_args)
    gc_statements = session_questions() - before_gc - 1
    gc_interval = get_settings().gc_interval
    gc_rate = gc_statements / gc_interval if gc_interval else 0.0
    details: dict[str, Any] = {
        "keys": IDLE_KEYS, "window_s": counted["seconds"], "statements": counted["total"],
        "statement_mix": counted["kinds"],
        # Cross-check only: the server's counter includes every other client.
        "server_questions_per_s_all_clients": round(
            (server_after - server_before - 1) / ctx.idle_seconds, 1),
        "other_clients_connected": int(others),
    }
    return [
        at_most("idle_queries", round(rate, 1), "queries/s", 20, details),
        at_most("idle_queries_with_gc", round(rate + gc_rate, 1), "queries/s", None, {
            "gc_pass_statements": gc_statements, "gc_interval_s": gc_interval,
            "gc_queries_per_s": round(gc_rate, 1)}),
        at_most("idle_drain", round(drain, 1), "s", None, {
            "what": f"worker launch until {IDLE_KEYS} one-message keys were acked"}),
    ]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "publish_single": publish_single,
    "publish_many": publish_many,
    "end_to_end": end_to_end,
    "latency": latency,
    "idle_queries": idle_queries,
}
