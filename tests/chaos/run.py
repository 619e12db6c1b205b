"""``make chaos``: run workers and publishers under faults, drain, report, and exit
non-zero if anything was lost, reordered, handled twice at once or dead-lettered without
cause, if a fault did not take effect, or if a log shows a traceback.

    python -m tests.chaos.run --seconds 180 [--seed N] [--json PATH] [--no-db-restart]
    python -m tests.chaos.run --failover pg|galera   (or --galera-spread)

The database comes from ``DATABASE_URL`` (default: the MariaDB test server); the run uses
its own database there (see ``settings.py``). With ``--failover`` or ``--galera-spread``
it runs on a fresh cluster of this machine instead (``failover.py``). docs/reliability.md
explains each fault and records the last full runs.
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
from typing import Any

import django

from django_sqlqueue.worker.faults import MAX_DELAY as RETRY_DELAY

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.chaos.settings")

from . import failover, poison, report, verify  # noqa: E402  (none needs Django set up)

WORKERS = 4  # plus one with a skewed clock
PUBLISHERS = (("steady", 2), ("bulk", 1), ("slow", 1), ("rollback", 1), ("poison", 1))
KILL_EVERY = (4.0, 7.0)  # seconds between two kill -9s
RESTART_AFTER = 1.0  # seconds from a kill to the restart
HANG_NUMBER = 1  # the message number of the one message whose first run hangs
# Seconds before and after a failover in which no worker is killed: the workers run through
# it (one starting during it is a case of its own), and its resume gap is its own.
FAILOVER_QUIET = (3.0, 15.0)
SUPERVISE_EVERY = 1.0  # seconds between two looks for workers that exited by themselves


@dataclass
class Event:
    at: float  # seconds from the start
    what: str
    detail: str = ""


def schedule(seconds: float, seed: int, lease: float, restart_db: str, lock: str,
             failover_detail: str = "") -> list[Event]:
    """The run's faults in time order. ``restart_db`` and ``lock``: why that fault cannot
    be applied here, or ''. ``failover_detail``: what fails over instead of the restart."""
    r = random.Random(seed)
    # After the lock is released: a restart would end the idle transaction early.
    restart_at = max(seconds * 0.55, seconds * 0.35 + lease + 3 + 2)
    quiet = (restart_at - FAILOVER_QUIET[0], restart_at + FAILOVER_QUIET[1]) \
        if failover_detail else (0.0, 0.0)
    events = [
        Event(0, "start", f"{WORKERS} workers, 1 worker with its clock {'+60s'} ahead, "
                          "publishers: 2 steady, 1 bulk (publish_many), 1 slow (transactions "
                          "open 2-4 s), 1 rolling back, 1 poison (malformed task messages, "
                          "too deep payloads, task outcomes that cannot be stored, among "
                          "normal tasks); one message whose handler hangs"),
    ]
    t = 5.0
    while t < seconds - 5:
        if not quiet[0] <= t <= quiet[1]:
            events.append(Event(round(t, 1), "kill", "kill -9 of a random worker, restarted "
                                                     f"{RESTART_AFTER:g} s later under its name"))
        t += r.uniform(*KILL_EVERY)
    events.append(Event(round(seconds * 0.25, 1), "pause",
                        f"SIGSTOP of a worker for {lease + 4:g} s (lease {lease:g} s), then SIGCONT"))
    events.append(Event(round(seconds * 0.35, 1), "lock",
                        f"an idle transaction locks a message row for {lease + 3:g} s"
                        + (f" (NOT EXERCISED: {lock})" if lock else "")))
    if failover_detail:
        events.append(Event(round(restart_at, 1), "failover",
                            f"{failover_detail}; no worker killed from "
                            f"{FAILOVER_QUIET[0]:g} s before to {FAILOVER_QUIET[1]:g} s after"))
    else:
        events.append(Event(round(restart_at, 1), "restart_db",
                            "the database server is stopped for 2 s and started again"
                            + (f" (NOT EXERCISED: {restart_db})" if restart_db else "")))
    events.append(Event(seconds, "end", "publishers stop; drain; report"))
    return sorted(events, key=lambda e: e.at)


class Run:
    def __init__(self, args: argparse.Namespace, directory: Path,
                 cluster: failover.ClusterRun | None = None) -> None:
        from . import fleet
        from .settings import LEASE_DURATION

        self.args = args
        self.directory = directory
        self.random = random.Random(args.seed)
        self.lease = LEASE_DURATION
        self.cluster = cluster
        url = cluster.process_url if cluster else (lambda index: None)
        self.workers = [fleet.Worker(f"chaos-{i + 1}", directory, database_url=url(i))
                        for i in range(WORKERS)]
        self.workers.append(fleet.Worker("chaos-skewed", directory, skewed=True,
                                         database_url=url(WORKERS)))
        self.supervising = threading.Event()
        self.paused: set[str] = set()
        self.timers: list[threading.Timer] = []
        self.threads: list[threading.Thread] = []
        self.problems: list[str] = []
        self.server: Any = None  # server.Server, when the run restarts it

    # ------------------------------------------------------------------ faults

    def kill_one(self) -> None:
        hanging = self.hanging()
        candidates = [w for w in self.workers
                      if w.alive and w.name not in self.paused and w.pid not in hanging]
        if not candidates:
            from . import records

            records.write("faults", e="kill_skipped", why="no live worker that may be killed")
            return
        worker = self.random.choice(candidates)
        worker.kill()
        self._later(RESTART_AFTER, worker.start)

    def hanging(self) -> set[int]:
        """Workers whose hung run has not yet outlived MAX_HANDLER_TIME: a kill would cut
        the hang short, and that fault would not be exercised."""
        from . import records
        from .settings import MAX_HANDLER_TIME

        now = time.monotonic()
        return {r["p"] for r in records.read(self.directory, "hang")
                if now - r["t"] < MAX_HANDLER_TIME + 2}

    def pause_one(self) -> None:
        candidates = [w for w in self.workers if w.alive and not w.skewed]
        if not candidates:
            return
        from . import records

        worker = self.random.choice(candidates)
        self.paused.add(worker.name)
        at = time.monotonic()
        worker.signal(signal.SIGSTOP)
        records.write("faults", e="stop", name=worker.name, pid=worker.pid, t=at,
                      state=worker.state("T"))

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
                took = restart_server(self.server)
                print(f"chaos: database unreachable for {took:.1f} s", flush=True)
            except Exception as exc:  # noqa: BLE001 - reported, and the run fails
                self.problems.append(f"restarting the database failed: {exc}")

        thread = threading.Thread(target=restart, name="chaos-restart", daemon=True)
        thread.start()
        self.threads.append(thread)

    def fail_over(self) -> None:
        assert self.cluster is not None
        cluster = self.cluster

        def fail_over() -> None:
            try:
                took = cluster.fail_over()
                print(f"chaos: clients could not write for {took:.1f} s", flush=True)
            except Exception as exc:  # noqa: BLE001 - reported, and the run fails
                self.problems.append(f"the failover failed: {exc}")

        thread = threading.Thread(target=fail_over, name="chaos-failover", daemon=True)
        thread.start()
        self.threads.append(thread)

    def supervise(self) -> None:
        """Until stopped, restart a worker that exited by itself, as a supervisor would;
        each such exit fails the run (the worker must outlive every fault)."""
        self.supervising.set()
        while self.supervising.is_set():
            for worker in self.workers:
                code = worker.exited_by_itself()
                if code is not None:
                    self.problems.append(f"worker {worker.name} exited by itself with status "
                                         f"{code}: {worker.last_lines()}")
                    self._later(RESTART_AFTER, worker.start)
            time.sleep(SUPERVISE_EVERY)

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
    parser.add_argument("--no-db-restart", action="store_true",
                        help="do not restart the database server (reported as not exercised)")
    on_cluster = parser.add_mutually_exclusive_group()
    on_cluster.add_argument("--failover", choices=failover.KINDS,
                            help="run on a fresh cluster of this machine (clusters/) whose "
                                 "writer fails over mid-run instead of the server restart: "
                                 "pg (primary stopped, replica promoted) or galera (the "
                                 "node behind HAProxy killed)")
    on_cluster.add_argument("--galera-spread", action="store_true",
                            help="run on a fresh Galera cluster with the workers and "
                                 "publishers spread over its three nodes (no failover)")
    args = parser.parse_args(argv)
    if args.seconds < 30:
        parser.error(f"--seconds must be at least 30, got {args.seconds:g}")
    if not args.seed:
        args.seed = random.randrange(1, 1_000_000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster = failover.make(args.failover, args.galera_spread)
    if cluster is None:
        return chaos(args, None)
    print(f"chaos: starting a fresh {cluster.kind} cluster", flush=True)
    try:
        cluster.start()
        os.environ["DATABASE_URL"] = cluster.database_url()
        return chaos(args, cluster)
    finally:
        cluster.stop()


def chaos(args: argparse.Namespace, cluster: failover.ClusterRun | None) -> int:
    directory = Path(tempfile.mkdtemp(prefix="sqlqueue-chaos-"))
    os.environ["CHAOS_DIR"] = str(directory)
    django.setup()
    from django.db import connection

    from . import database, fleet, records
    from .server import Server
    from .settings import MAX_HANDLER_TIME

    database.prepare()
    server = Server()
    fails_over = cluster is not None and cluster.fails_over
    restart_db = "--no-db-restart" if args.no_db_restart else server.unavailable
    if cluster is not None:
        restart_db = "the writer fails over instead" if fails_over else \
            f"{cluster.describe()}: no one server to restart"
    lock = "SQLite's one writer would block everybody" if connection.vendor == "sqlite" else ""
    if fleet.libfaketime() == "":
        print("chaos: libfaketime is not installed (apt-get install faketime)", file=sys.stderr)
        return 2
    run = Run(args, directory, cluster)
    run.server = server
    events = schedule(args.seconds, args.seed, run.lease, restart_db, lock,
                      cluster.describe() if cluster is not None and fails_over else "")
    print(f"chaos: {database.describe()}, {args.seconds:g} s, seed {args.seed}, "
          f"records in {directory}")
    if cluster is not None:
        print(f"chaos: on a {cluster.kind} cluster: {cluster.describe()}")
    elif not restart_db:
        print(f"chaos: restarts {server.describe()}")
    print("chaos: schedule")
    for event in events:
        print(f"  t={event.at:6.1f}s  {event.what:<10} {event.detail}")
    sys.stdout.flush()
    records.write("faults", e="clock", wall=time.time())
    for fault, why in (("restart_db", "" if fails_over else restart_db), ("lock", lock)):
        if why:
            records.write("faults", e="not_exercised", fault=fault, why=why)

    publish_hang()
    for worker in run.workers:
        worker.start()
    kinds = [kind for kind, count in PUBLISHERS for _ in range(count)]
    # Publisher numbers start at 1: message numbers below 10,000,000 are the run's own.
    publishers = [fleet.start_publisher(kind, index, args.seconds, args.seed, directory,
                                        cluster.process_url(index) if cluster else None)
                  for index, kind in enumerate(kinds, start=1)]
    started = time.monotonic()
    supervisor = threading.Thread(target=run.supervise, name="chaos-supervisor", daemon=True)
    supervisor.start()
    actions = {"kill": run.kill_one, "pause": run.pause_one,
               "lock": (lambda: None) if lock else run.hold_lock,
               "restart_db": (lambda: None) if restart_db else run.restart_db,
               "failover": run.fail_over}
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
    run.supervising.clear()
    supervisor.join(SUPERVISE_EVERY * 5)
    for timer in run.timers:
        timer.join(30)
    for worker in run.workers:
        if not worker.alive:
            worker.start()  # a kill whose restart is still pending

    print(f"chaos: t={time.monotonic() - started:6.1f}s publishers done; draining", flush=True)
    drain(run, directory, args.drain_timeout)
    drained_at = time.monotonic() - started
    if cluster is not None and cluster.kind == "pg":
        # Each worker's wake-up listener must have found the new primary by now.
        listening = database.safely(lambda: failover.listeners(connection), -1)
        records.write("faults", e="listeners", n=listening,
                      workers=sum(w.alive for w in run.workers))
    print(f"chaos: t={drained_at:6.1f}s drained; stopping workers", flush=True)
    for worker in run.workers:
        code = worker.stop(timeout=15)
        # 3: stopped with the hung handler still running, as documented.
        if code not in (0, 3):
            run.problems.append(f"worker {worker.name} exited with {code}")
    records.write("faults", e="workers_stopped")

    plan = verify.Plan(
        kills=sum(e.what == "kill" for e in events), pauses=1, pause_seconds=run.lease + 4,
        skew_seconds=float(fleet.CLOCK_SKEW.rstrip("s")), lock_seconds=run.lease + 3,
        max_handler_time=MAX_HANDLER_TIME, vendor=connection.vendor,
        failover=cluster.kind if cluster is not None and fails_over else "", lease=run.lease,
        retry_delay=RETRY_DELAY)
    return finish(run, args, directory, plan, drained_at)


def publish_hang() -> None:
    """The one message whose first run hangs, recorded as the publishers record theirs."""
    import django_sqlqueue as sqlqueue

    from . import records
    from .settings import TOPIC

    asked = time.monotonic()
    stored = sqlqueue.publish(TOPIC, {"n": HANG_NUMBER, "hang": True}, key="hang",
                              id=f"m{HANG_NUMBER}")
    records.write("published", e="committed", tx=0, ns=[HANG_NUMBER], keys=["hang"],
                  offsets=[stored.offset], flags={HANG_NUMBER: "hang"}, c0=asked,
                  c1=time.monotonic())


def drain(run: Run, directory: Path, timeout: float) -> None:
    """Wait until every stored row is handled or dead-lettered in every group, lag 0."""
    from . import database

    published = report.read_published(directory)
    suffix = sqlqueue_suffix()
    deadline = time.monotonic() + timeout
    while True:
        lags = database.safely(lambda: database.lag(report.GROUPS), None)
        if lags is not None:
            lags[poison.TASK_GROUP] = database.safely(poison.pending, 1)
        if lags is not None and not any(lags.values()):
            runs = report.read_runs(directory)
            dead = database.safely(lambda: database.dead_letters(report.GROUPS, suffix), None)
            if dead is not None and all(
                    set(published.rows) <= ({r.offset for r in runs if r.group == g and r.ok}
                                            | set(dead[g]))
                    for g in report.GROUPS):
                return
        if time.monotonic() > deadline:
            run.problems.append(f"not drained after {timeout:g} s: lag {lags}")
            return
        time.sleep(2)


def finish(run: Run, args: argparse.Namespace, directory: Path, plan: verify.Plan,
           drained_at: float) -> int:
    """Read everything back, print the report, and return the exit status."""
    from django.db import connection

    from . import database

    published = report.read_published(directory)
    runs = report.read_runs(directory)
    faults = report.read_faults(directory)
    dead = database.dead_letters(report.GROUPS, sqlqueue_suffix())
    lags = database.lag(report.GROUPS)
    reports = [report.analyse(g, published, runs, faults, dead[g], lags[g])
               for g in report.GROUPS]
    checks = verify.check_faults(plan, faults, runs, published, report.GROUPS)
    keys = len({row.key for row in published.rows.values()})
    print()
    print(f"chaos: {len(published.rows)} rows stored ({len(published.committed)} messages) "
          f"over {keys} keys, {len(published.rolled_back)} rolled back, "
          f"{published.retries} publishing transactions retried after database faults; "
          f"{len(runs)} handler runs; drained {drained_at - args.seconds:.1f} s after the "
          "publishers stopped")
    print(verify_table(checks))
    print(report.table(reports))
    if text := report.explanations(reports):
        print(text)
    after_gc, twice = report.stored_twice(published, runs)
    print(f"chaos: {published.duplicates} re-publishes of committed ids: "
          f"{published.duplicates - after_gc} found the stored message, {after_gc} came after "
          f"GC had collected it and were stored anew (the idempotency window ends at GC); "
          f"{len(twice)} stored twice otherwise")
    poisoned = poison.verify(directory, sqlqueue_suffix())
    print(poisoned.line())
    errors, expected = verify.log_problems(directory)
    for why, count in sorted(expected.items()):
        print(f"chaos: {count} expected log line(s): {why}")
    failures = run.problems + twice[:20] + [f for r in reports for f in r.failures()]
    failures += poisoned.failures[:20]
    failures += [f"fault {c.fault} did not take effect: {c.detail}" for c in checks if c.failed]
    if errors:
        failures.append(f"{len(errors)} traceback(s) or ERROR line(s) in the logs, e.g.:\n    "
                        + "\n    ".join(errors[:5]))
    unexercised = [f"{c.fault} ({c.detail})" for c in checks if c.status == "not exercised"]
    if args.json:
        Path(args.json).write_text(json.dumps({
            "seconds": args.seconds, "seed": args.seed, "vendor": connection.vendor,
            "stored": len(published.rows), "keys": keys,
            "faults": [vars(c) for c in checks], "not_exercised": unexercised,
            "groups": [report.as_dict(r) for r in reports], "failures": failures,
        }, indent=2))
    if failures:
        print("chaos: FAILED\n  " + "\n  ".join(failures))
        print(f"chaos: records and logs kept in {directory}")
        return 1
    if unexercised:
        print("chaos: NOT EXERCISED in this run: " + "; ".join(unexercised))
    print("chaos: passed" + (" (with faults not exercised, above)" if unexercised else ""))
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def verify_table(checks: list[verify.FaultCheck]) -> str:
    return report.markdown([("fault", "applied", "took effect", "evidence"),
                            *((c.fault, str(c.applied), c.status, c.detail) for c in checks)])


def sqlqueue_suffix() -> str:
    from django_sqlqueue.conf import get_settings

    return get_settings().dlq_suffix


if __name__ == "__main__":
    sys.exit(main())
