"""The throughput benchmark: this checkout's worker next to an earlier one's, in one run.

    make bench BENCH_ARGS="--only throughput --baseline-library ../baseline"

``--baseline-library`` names a checkout (a ``git worktree`` of an earlier commit) whose
``django_sqlqueue`` package the baseline side runs; without it only this checkout is
measured. Each side drains a backlog of no-op subscriber messages and of no-op tasks with
two workers, in rounds that alternate which side goes first (medians of ``ROUNDS``), so
load from outside the benchmark hits both alike. The same benchmark code drives both
sides; each side fills and drains a database of its own (migrated by its own code).

For every drain it reports completed per second and CPU per message: the two workers'
CPU time and the database server's (its processes on this machine), read from /proc over
the window from the first completed message to the last, so neither the interpreters'
start nor an idle tail counts.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import suite
from .suite import Context, Result

ROUNDS = 3
WORKERS = 2
KINDS = ("messages", "tasks")
THROUGHPUT_RATIO = 2.0  # completed/s, this checkout over the baseline
CPU_RATIO = 0.5  # CPU per message, this checkout over the baseline
SIDE_TIMEOUT = 600.0  # seconds for one side's fill, drain and stop
# What each kind drains: (consumer group, topic), and the worker's arguments.
DRAINED = {
    "messages": (("bench", "bench"), ["--group", "bench", "--topic", "bench"]),
    "tasks": (("tasks", "tasks.bench"), ["--queue", "bench"]),
}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def throughput(ctx: Context) -> list[Result]:
    sides: dict[str, Path] = {"current": suite.REPO_ROOT}
    if ctx.baseline_library:
        sides["baseline"] = Path(ctx.baseline_library).resolve()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {
        (side, kind): [] for side in sides for kind in KINDS}
    for n in range(ROUNDS):
        order = list(sides) if n % 2 == 0 else list(reversed(sides))
        for kind in KINDS:
            for side in order:
                ctx.log(f"  round {n + 1}: {side}, {ctx.throughput_messages} {kind}")
                run = _run_side(ctx, side, sides[side], kind)
                ctx.log(f"    {run['rate']:.0f}/s, worker {run['worker_ms_per_message']} ms "
                        f"+ database {run['database_ms_per_message']} ms per message")
                runs[(side, kind)].append(run)
    results = []
    for kind in KINDS:
        details: dict[str, Any] = {
            "rounds": ROUNDS, "workers": WORKERS, "per_round": ctx.throughput_messages,
            **{side: runs[(side, kind)] for side in sides},
        }
        if "baseline" in sides:
            details["baseline_library"] = str(sides["baseline"])
            details["baseline_commit"] = _commit_of(sides["baseline"])
        rate = _median(runs[("current", kind)], "rate")
        base_rate = _median(runs[("baseline", kind)], "rate") if "baseline" in sides else None
        cpu = _median(runs[("current", kind)], "cpu_ms_per_message")
        base_cpu = (_median(runs[("baseline", kind)], "cpu_ms_per_message")
                    if "baseline" in sides else None)
        completed = Result(f"throughput_{kind}", rate, "msg/s", base_rate, details=details)
        per_message = Result(f"cpu_per_message_{kind}", cpu, "ms", base_cpu, details={
            side: {"worker_ms": _median(runs[(side, kind)], "worker_ms_per_message"),
                   "database_ms": _median(runs[(side, kind)], "database_ms_per_message")}
            for side in sides})
        if base_rate:
            completed.target = f"ratio >= {THROUGHPUT_RATIO:g}"
            completed.met = rate is not None and rate / base_rate >= THROUGHPUT_RATIO
        if base_cpu:
            per_message.target = f"ratio <= {CPU_RATIO:g}"
            per_message.met = cpu is not None and cpu / base_cpu <= CPU_RATIO
        results += [completed, per_message]
    return results


def _median(runs: list[dict[str, Any]], name: str) -> float | None:
    values = [run[name] for run in runs if run.get(name) is not None]
    return round(statistics.median(values), 3) if values else None


def _commit_of(checkout: Path) -> str | None:
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],  # noqa: S603,S607 - git from PATH, fixed arguments
                           capture_output=True, text=True, check=False)
    return found.stdout.strip() or None


def _run_side(ctx: Context, side: str, checkout: Path, kind: str) -> dict[str, Any]:
    """One fill-and-drain in a process of its own that imports ``checkout``'s library."""
    env = dict(os.environ)
    paths = [str(suite.REPO_ROOT)]
    if side != "current":
        # A directory holding only the other checkout's package, ahead of this one: the
        # benchmark code stays this checkout's, the library is the other's.
        shadow = ctx.work_dir / f"library-{side}"
        shadow.mkdir(exist_ok=True)
        link = shadow / "django_sqlqueue"
        if not link.exists():
            link.symlink_to(checkout / "django_sqlqueue")
        paths.insert(0, str(shadow))
        env["SQLQUEUE_BENCH_DB"] = f"{os.environ.get('SQLQUEUE_BENCH_DB') or 'sqlqueue_bench'}_{side}"
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    env["SQLQUEUE_THROUGHPUT_LOGS"] = str(ctx.work_dir)
    env["SQLQUEUE_BENCH_SECOND_URL"] = ""  # no alias an earlier checkout would trip on
    done = subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-m", "benchmarks.throughput", kind, str(ctx.throughput_messages),
         f"{side}-{kind}"],
        # Not from the checkout: ``-m`` puts the working directory first on sys.path.
        cwd=ctx.work_dir, env=env, capture_output=True, text=True, timeout=SIDE_TIMEOUT,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"{side} {kind}: exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the side's process


def _side_main(kind: str, count: int, tag: str) -> dict[str, Any]:
    from benchmarks import database
    from benchmarks.settings import DATABASES

    db = DATABASES["default"]
    database.ensure_database(db)
    import django

    django.setup()
    from django.core.management import call_command

    import django_sqlqueue

    call_command("migrate", verbosity=0, interactive=False)
    database.truncate(db, (*database.QUEUE_TABLES, "queue_task_results"))
    _fill(kind, count)
    (group, topic), args = DRAINED[kind]
    work_dir = Path(os.environ["SQLQUEUE_THROUGHPUT_LOGS"])
    workers = []
    for n in range(WORKERS):
        log = open(work_dir / f"throughput-{tag}-{n}.log", "ab")  # noqa: SIM115 - the child's
        workers.append(subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
            [sys.executable, "-m", "django", "runqueueworker", *args,
             "--name", f"throughput-{tag}-{n}"],
            cwd=os.getcwd(), env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT))
        log.close()
    server = _server_pids(db)
    try:
        started = _wait_for_first(group, topic, workers)
        before = _cpu(workers, server)
        acked_before = _acked(group, topic)
        finished = _wait_for_all(group, topic, count, workers)
        after = _cpu(workers, server)
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    seconds = finished - started
    handled = count - acked_before
    worker_s = after["workers"] - before["workers"]
    database_s = (sum(cpu - before["database"].get(pid, 0.0)
                      for pid, cpu in after["database"].items()) if server else None)
    return {
        "library": os.path.dirname(os.path.realpath(django_sqlqueue.__file__)),
        "messages": handled, "seconds": round(seconds, 3), "rate": round(handled / seconds, 1),
        "worker_cpu_s": round(worker_s, 2),
        "database_cpu_s": None if database_s is None else round(database_s, 2),
        "machine_busy_s": round(after["machine"] - before["machine"], 2),
        "worker_ms_per_message": round(worker_s * 1000 / handled, 3),
        "database_ms_per_message": (None if database_s is None
                                    else round(database_s * 1000 / handled, 3)),
        "cpu_ms_per_message": (None if database_s is None
                               else round((worker_s + database_s) * 1000 / handled, 3)),
        "load_average": round(os.getloadavg()[0], 2),
    }


def _fill(kind: str, count: int) -> None:
    from django.db import transaction

    if kind == "messages":
        suite.publish_in_batches("bench", count, lambda i: f"k{i % suite.E2E_KEYS}")
        return
    from benchmarks.benchapp.tasks import noop

    for start in range(0, count, 1000):
        with transaction.atomic():
            for _ in range(min(1000, count - start)):
                noop.enqueue()


def _watermarks(group: str, topic: str) -> dict[str, int]:
    return dict(suite.fetch_all(
        "SELECT partition_key, offset_acked FROM queue_offsets "
        "WHERE consumer_group = %s AND topic = %s", [group, topic]))


def _acked(group: str, topic: str) -> int:
    """Messages of ``topic`` at or below their partition's watermark."""
    return int(suite.fetch_all(
        "SELECT COUNT(*) FROM queue_messages m JOIN queue_offsets o "
        "ON o.topic = m.topic AND o.partition_key = m.partition_key "
        "WHERE o.consumer_group = %s AND m.topic = %s AND m.position <= o.offset_acked",
        [group, topic])[0][0])


def _check_alive(workers: list[subprocess.Popen[bytes]]) -> None:
    for proc in workers:
        if proc.poll() is not None:
            raise RuntimeError(f"worker {proc.pid} exited with status {proc.returncode}")


def _wait_for_first(group: str, topic: str, workers: list[subprocess.Popen[bytes]]) -> float:
    deadline = time.monotonic() + SIDE_TIMEOUT / 2
    while time.monotonic() < deadline:
        if any(v > 0 for v in _watermarks(group, topic).values()):
            return time.monotonic()
        _check_alive(workers)
        time.sleep(0.01)
    raise RuntimeError(f"{topic}: nothing acked within {SIDE_TIMEOUT / 2:g} s")


def _wait_for_all(group: str, topic: str, count: int,
                  workers: list[subprocess.Popen[bytes]]) -> float:
    deadline = time.monotonic() + SIDE_TIMEOUT / 2
    targets: dict[str, int] | None = None
    while time.monotonic() < deadline:
        now = time.monotonic()
        if targets is None and suite.last_position() >= count:
            targets = {k: int(v) for k, v in suite.fetch_all(
                "SELECT partition_key, MAX(position) FROM queue_messages WHERE topic = %s "
                "GROUP BY partition_key", [topic])}
        marks = _watermarks(group, topic)
        if targets is not None and all(marks.get(k, 0) >= v for k, v in targets.items()):
            return now
        _check_alive(workers)
        time.sleep(0.01)
    raise RuntimeError(f"{topic}: not drained within {SIDE_TIMEOUT / 2:g} s")


def _server_pids(db: dict[str, Any]) -> list[str] | None:
    """The database server's process names to count, when it runs on this machine."""
    host = str(db.get("HOST") or "localhost")
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("/"):
        return None
    engine = str(db["ENGINE"])
    if engine.endswith("mysql"):
        return ["mariadbd", "mysqld"]
    if engine.endswith("postgresql"):
        return ["postgres"]
    return None  # SQLite runs inside the workers


def _cpu(workers: list[subprocess.Popen[bytes]], server: list[str] | None) -> dict[str, Any]:
    """CPU seconds so far: the workers', the database server's processes' (by pid: a
    process that exits meanwhile must not count as negative time), and the machine's busy
    time."""
    worker_s = sum(_process_cpu(str(proc.pid)) for proc in workers)
    database_s: dict[str, float] = {}
    if server:
        for pid in os.listdir("/proc"):
            if pid.isdigit() and _name(pid) in server:
                database_s[pid] = _process_cpu(pid)
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    return {"workers": worker_s, "database": database_s, "machine": busy / CLOCK_TICKS}


def _name(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def _process_cpu(pid: str) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


BENCHMARKS = {"throughput": throughput}


if __name__ == "__main__":
    print(json.dumps(_side_main(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
