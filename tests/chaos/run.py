"""``make chaos``: run workers and publishers under faults, drain, report, and exit
non-zero if anything was lost, reordered, handled twice at once or dead-lettered without
cause.

    python -m tests.chaos.run --seconds 180 [--seed N] [--json PATH]

The database comes from ``DATABASE_URL`` (default: the MariaDB test server); the run uses
its own database there (see ``settings.py``). docs/reliability.md explains each fault and
records the last full run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.chaos.settings")

WORKERS = 4  # plus one with a skewed clock
PUBLISHERS = (("steady", 2), ("bulk", 1), ("slow", 1), ("rollback", 1))
KILL_EVERY = (4.0, 7.0)  # seconds between two kill -9s
RESTART_AFTER = 1.0  # seconds from a kill to the restart
HANG_NUMBER = 1  # the message number of the one message whose first run hangs


@dataclass
class Event:
    at: float  # seconds from the start
    what: str
    detail: str = ""


def schedule(seconds: float, seed: int, lease: float, restart_db: str, lock: str) -> list[Event]:
    r = random.Random(seed)
    events = [
        Event(0, "start", f"{WORKERS} workers, 1 worker with its clock {'+60s'} ahead, "
                          "publishers: 2 steady, 1 bulk (publish_many), 1 slow (transactions "
                          "open 2-4 s), 1 rolling back; one message whose handler hangs"),
    ]
    t = 5.0
    while t < seconds - 5:
        events.append(Event(round(t, 1), "kill", "kill -9 of a random worker, restarted "
                                                 f"{RESTART_AFTER:g} s later under its name"))
        t += r.uniform(*KILL_EVERY)
    events.append(Event(round(seconds * 0.25, 1), "pause",
                        f"SIGSTOP of a worker for {lease + 4:g} s (lease {lease:g} s), then SIGCONT"))
    events.append(Event(round(seconds * 0.35, 1), "lock",
                        f"an idle transaction locks a message row for {lease + 3:g} s"
                        + (f" (skipped: {lock})" if lock else "")))
    events.append(Event(round(seconds * 0.55, 1), "restart_db",
                        "the database server is stopped for 2 s and started again"
                        + (f" (skipped: {restart_db})" if restart_db else "")))
    events.append(Event(seconds, "end", "publishers stop; drain; report"))
    return sorted(events, key=lambda e: e.at)


class Run:
    def __init__(self, args: argparse.Namespace, directory: Path) -> None:
        from . import fleet
        from .settings import LEASE_DURATION

        self.args = args
        self.directory = directory
        self.random = random.Random(args.seed)
        self.lease = LEASE_DURATION
        self.workers = [fleet.Worker(f"chaos-{i + 1}", directory) for i in range(WORKERS)]
        self.workers.append(fleet.Worker("chaos-skewed", directory, skewed=True))
        self.paused: set[str] = set()
        self.timers: list[threading.Timer] = []
        self.threads: list[threading.Thread] = []
        self.problems: list[str] = []

    # ------------------------------------------------------------------ faults

    def kill_one(self) -> None:
        candidates = [w for w in self.workers if w.alive and w.name not in self.paused]
        if not candidates:
            return
        worker = self.random.choice(candidates)
        worker.kill()
        self._later(RESTART_AFTER, worker.start)

    def pause_one(self) -> None:
        candidates = [w for w in self.workers if w.alive and not w.skewed]
        if not candidates:
            return
        from . import records

        worker = self.random.choice(candidates)
        self.paused.add(worker.name)
        records.write("faults", e="stop", name=worker.name, pid=worker.pid)
        worker.signal(signal.SIGSTOP)

        def resume() -> None:
            records.write("faults", e="cont", name=worker.name, pid=worker.pid)
            worker.signal(signal.SIGCONT)
            self.paused.discard(worker.name)

        self._later(self.lease + 4, resume)

    def hold_lock(self) -> None:
        from .database import LockHolder

        holder = LockHolder(self.lease + 3)
        holder.start()
        self.threads.append(holder)

    def restart_db(self) -> None:
        from .database import restart_server

        def restart() -> None:
            try:
                took = restart_server()
                print(f"chaos: database unreachable for {took:.1f} s", flush=True)
            except Exception as exc:  # noqa: BLE001 - reported, and the run fails
                self.problems.append(f"restarting the database failed: {exc}")

        thread = threading.Thread(target=restart, name="chaos-restart", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _later(self, seconds: float, fn: object) -> None:
        timer = threading.Timer(seconds, fn)  # type: ignore[arg-type]
        timer.daemon = True
        timer.start()
        self.timers.append(timer)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="django-sqlqueue chaos run")
    parser.add_argument("--seconds", type=float,
                        default=float(os.environ.get("CHAOS_SECONDS") or 180),
                        help="how long publishers run and faults are injected (default 180, "
                             "or $CHAOS_SECONDS)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or 0),
                        help="seed of the schedule and of the publishers (default: random)")
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="seconds the drain may take after the publishers stop")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    args = parser.parse_args(argv)
    if args.seconds < 30:
        parser.error(f"--seconds must be at least 30, got {args.seconds:g}")
    if not args.seed:
        args.seed = random.randrange(1, 1_000_000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="sqlqueue-chaos-"))
    os.environ["CHAOS_DIR"] = str(directory)
    django.setup()
    from . import database, fleet, records, report
    from .settings import TOPIC

    database.prepare()
    restart_db = database.restart_command()
    from django.db import connection

    lock = "SQLite's one writer would block everybody" if connection.vendor == "sqlite" else ""
    if fleet.libfaketime() == "":
        print("chaos: libfaketime is not installed (apt-get install faketime)", file=sys.stderr)
        return 2
    run = Run(args, directory)
    events = schedule(args.seconds, args.seed, run.lease, restart_db, lock)
    print(f"chaos: {database.describe()}, {args.seconds:g} s, seed {args.seed}, "
          f"records in {directory}")
    print("chaos: schedule")
    for event in events:
        print(f"  t={event.at:6.1f}s  {event.what:<10} {event.detail}")
    sys.stdout.flush()

    import django_sqlqueue as sqlqueue

    sqlqueue.publish(TOPIC, {"n": HANG_NUMBER, "hang": True}, key="hang", id=f"m{HANG_NUMBER}")
    records.write("published", e="committed", ns=[HANG_NUMBER], flags={HANG_NUMBER: "hang"})
    for worker in run.workers:
        worker.start()
    kinds = [kind for kind, count in PUBLISHERS for _ in range(count)]
    # Publisher numbers start at 1: message numbers below 10,000,000 are the run's own.
    publishers = [fleet.start_publisher(kind, index, args.seconds, args.seed, directory)
                  for index, kind in enumerate(kinds, start=1)]
    started = time.monotonic()
    actions = {"kill": run.kill_one, "pause": run.pause_one,
               "lock": (lambda: None) if lock else run.hold_lock,
               "restart_db": (lambda: None) if restart_db else run.restart_db}
    for event in events:
        if event.what not in actions:
            continue
        time.sleep(max(0.0, started + event.at - time.monotonic()))
        print(f"chaos: t={time.monotonic() - started:6.1f}s {event.what}", flush=True)
        actions[event.what]()
    time.sleep(max(0.0, started + args.seconds - time.monotonic()))
    codes = fleet.wait_all(publishers, timeout=60)
    if any(code != 0 for code in codes):
        run.problems.append(f"publisher exit codes {codes} (logs in {directory})")
    for thread in run.threads:
        thread.join(60)
    for timer in run.timers:
        timer.join(30)
    for worker in run.workers:
        if not worker.alive:
            worker.start()  # a kill whose restart is still pending

    # Drain: every committed message handled or dead-lettered in every group, lag 0.
    print(f"chaos: t={time.monotonic() - started:6.1f}s publishers done; draining", flush=True)
    published = report.read_published(directory)
    suffix = sqlqueue_suffix()
    deadline = time.monotonic() + args.drain_timeout
    while True:
        lags = database.safely(lambda: database.lag(report.GROUPS), None)
        if lags is not None and not any(lags.values()):
            runs = report.read_runs(directory)
            dead = database.safely(lambda: database.dead_letters(report.GROUPS, suffix),
                                   {g: set() for g in report.GROUPS})
            done = {g: {r.n for r in runs if r.group == g and r.ok} | dead[g]
                    for g in report.GROUPS}
            if all(published.committed <= done[g] for g in report.GROUPS):
                break
        if time.monotonic() > deadline:
            run.problems.append(f"not drained after {args.drain_timeout:g} s: lag {lags}")
            break
        time.sleep(2)
    drained_at = time.monotonic() - started
    print(f"chaos: t={drained_at:6.1f}s drained; stopping workers", flush=True)
    for worker in run.workers:
        code = worker.stop(timeout=15)
        # 3: stopped with the hung handler still running, as documented.
        if code not in (0, 3):
            run.problems.append(f"worker {worker.name} exited with {code}")
    records.write("faults", e="workers_stopped")

    runs = report.read_runs(directory)
    faults = report.read_faults(directory)
    dead = database.dead_letters(report.GROUPS, suffix)
    lags = database.lag(report.GROUPS)
    reports = [report.analyse(g, published, runs, faults, dead[g], lags[g])
               for g in report.GROUPS]
    keys = len({r.key for r in runs})
    print()
    print(f"chaos: {len(published.committed)} messages committed over {keys} keys, "
          f"{len(published.rolled_back)} rolled back, "
          f"{published.retries} publishing transactions retried after database faults; "
          f"{len(faults.kills)} kill -9, {sum(len(p) for p in faults.pauses.values())} pause(s), "
          f"{len(faults.db_outages)} database restart(s); {len(runs)} handler runs; drained "
          f"{drained_at - args.seconds:.1f} s after the publishers stopped")
    print(report.table(reports))
    if text := report.explanations(reports):
        print(text)
    after_gc, twice = report.stored_twice(published, runs)
    print(f"chaos: {published.duplicates} re-publishes of committed ids: "
          f"{published.duplicates - after_gc} found the stored message, {after_gc} came after "
          f"GC had collected it and were stored anew (the idempotency window ends at GC); "
          f"{len(twice)} stored twice otherwise")
    failures = run.problems + twice[:20] + [f for r in reports for f in r.failures()]
    errors = unexpected_log_lines(directory)
    if errors:
        print(f"chaos: {len(errors)} unexpected log line(s), e.g.:\n  " + "\n  ".join(errors[:5]))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "seconds": args.seconds, "seed": args.seed, "vendor": connection.vendor,
            "committed": len(published.committed), "keys": keys,
            "groups": [report.as_dict(r) for r in reports], "failures": failures,
        }, indent=2))
    if failures:
        print("chaos: FAILED\n  " + "\n  ".join(failures))
        print(f"chaos: records and logs kept in {directory}")
        return 1
    print("chaos: passed")
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def sqlqueue_suffix() -> str:
    from django_sqlqueue.conf import get_settings

    return get_settings().dlq_suffix


def unexpected_log_lines(directory: Path) -> list[str]:
    """Worker log lines that point at a bug rather than at an injected fault."""
    found = []
    for path in sorted(directory.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "unexpected error" in line or line.startswith("Traceback"):
                found.append(f"{path.name}: {line[:300]}")
    return found


if __name__ == "__main__":
    sys.exit(main())
