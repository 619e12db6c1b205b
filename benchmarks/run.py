#!/usr/bin/env python
"""Run the django-sqlqueue benchmarks against ``DATABASE_URL`` and print a results table.

    DATABASE_URL=mysql://root@127.0.0.1:3306/test python benchmarks/run.py
    python benchmarks/run.py --only end_to_end --only latency --seconds 10
    python benchmarks/run.py --json benchmarks/results/latest.json
    python benchmarks/run.py --only tasks          # the Tasks backend vs django-tasks-db
    python benchmarks/run.py --only recovery       # a worker killed and restarted
    python benchmarks/run.py --only restart        # the database server stopped for 30 s
    python benchmarks/run.py --only scaleout       # one MariaDB server vs two

``restart`` stops and starts the very server ``DATABASE_URL`` names (when it runs on this
machine), as the chaos run does: run it against a server nobody else is using.
The benchmarks use their own database (``sqlqueue_bench``, created when missing; for
SQLite a ``sqlqueue_bench.sqlite3`` next to the configured file), migrate it, and empty
the queue tables before each measurement. See docs/benchmarks.md for what each figure
means and the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

NAMES = ["publish_single", "publish_many", "end_to_end", "latency", "latency_workers",
         "latency_notify", "idle_queries", "many_keys", "scale", "fleet", "admin_pages",
         "tasks", "waiting", "schedules", "limits", "notify_volume", "recovery", "restart", "scaleout",
         "throughput"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="django-sqlqueue benchmarks (database from DATABASE_URL).")
    parser.add_argument("--only", action="append", choices=NAMES, metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(NAMES)}")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="duration of each publish measurement, and of its baseline "
                             "(default: 5)")
    parser.add_argument("--json", metavar="PATH", nargs="?",
                        const=str(REPO_ROOT / "benchmarks" / "results" / "latest.json"),
                        help="also write the results as JSON (default path: "
                             "benchmarks/results/latest.json)")
    parser.add_argument("--messages", type=int, default=20_000,
                        help="messages for end_to_end (default: 20000)")
    parser.add_argument("--latency-seconds", type=float, default=15.0,
                        help="how long latency publishes at 20 msg/s (default: 15)")
    parser.add_argument("--idle-seconds", type=float, default=10.0,
                        help="idle_queries counting window (default: 10)")
    parser.add_argument("--scale-messages", type=int, default=1_000_000,
                        help="messages (each with its own key) for scale (default: 1000000)")
    parser.add_argument("--scale-timeout", type=float, default=1800.0,
                        help="how long scale may take to drain, in seconds (default: 1800)")
    parser.add_argument("--fleet-sizes", default="8,16,32",
                        help="comma-separated worker counts for fleet (default: 8,16,32)")
    parser.add_argument("--admin-messages", type=int, default=1_000_000,
                        help="messages in the log for admin_pages (default: 1000000)")
    parser.add_argument("--admin-dead-letters", type=int, default=100_000,
                        help="dead letters for admin_pages (default: 100000)")
    parser.add_argument("--tasks", type=int, default=5_000,
                        help="no-op tasks tasks enqueues and drains on django-sqlqueue's "
                             "backend in each of three rounds (default: 5000)")
    parser.add_argument("--baseline-tasks", type=int, default=1_000,
                        help="... and on django-tasks-db's, which is slower (default: 1000)")
    parser.add_argument("--waiting", type=int, default=50_000,
                        help="messages waiting in one partition for waiting (delayed a "
                             "day; behind a failing key) (default: 50000)")
    parser.add_argument("--schedules", type=int, default=10_000,
                        help="run-time schedules stored for schedules (default: 10000)")
    parser.add_argument("--schedule-seconds", type=float, default=30.0,
                        help="how long schedules fires 300 of them, 5 ticks a second "
                             "(default: 30)")
    parser.add_argument("--notify-seconds", type=float, default=120.0,
                        help="how long notify_volume's 8 threads publish while the listener's "
                             "backlog is sampled (PostgreSQL; default: 120)")
    parser.add_argument("--recovery-rate", type=float, default=200.0,
                        help="messages per second recovery publishes while one of its two "
                             "workers is killed and restarted (default: 200)")
    parser.add_argument("--recovery-seconds", type=float, default=60.0,
                        help="how long recovery waits between the kill and the restart "
                             "(default: 60)")
    parser.add_argument("--scaleout-messages", type=int, default=20_000,
                        help="messages per topic in each scaleout round (default: 20000)")
    parser.add_argument("--restart-down", type=float, default=30.0,
                        help="seconds restart keeps the database server stopped (default: 30)")
    parser.add_argument("--baseline-library", metavar="CHECKOUT",
                        help="throughput: a checkout of an earlier commit whose django_sqlqueue "
                             "the baseline side runs (e.g. a git worktree)")
    parser.add_argument("--throughput-messages", type=int, default=20_000,
                        help="throughput: messages (and tasks) per drain (default: 20000)")
    parser.add_argument("--profile", action="store_true",
                        help="MariaDB/MySQL: also count the end_to_end workers' statements "
                             "by kind and table (adds a little overhead)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the worker logs even when every benchmark succeeded")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.messages < 1 or args.latency_seconds <= 0 \
            or args.idle_seconds <= 0 or args.scale_messages < 1 or args.scale_timeout <= 0 \
            or args.tasks < 2 or args.baseline_tasks < 2 or args.notify_seconds <= 0 \
            or args.recovery_rate <= 0 or args.recovery_seconds <= 0 \
            or args.restart_down <= 0 or args.throughput_messages < 100:
        parser.error("durations and message counts must be positive")
    try:
        args.fleet_sizes = tuple(int(n) for n in args.fleet_sizes.split(","))
    except ValueError:
        parser.error(f"--fleet-sizes must be comma-separated numbers, got {args.fleet_sizes!r}")
    if any(n < 1 for n in args.fleet_sizes):
        parser.error("--fleet-sizes must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A run stopped with SIGTERM or SIGHUP (timeout, a closed terminal) still stops the
    # workers it started, in the finally below: left running, they would join the next
    # run's drains.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda signum, _frame: sys.exit(128 + signum))
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"

    from benchmarks import database
    from benchmarks.settings import DATABASES

    db = DATABASES["default"]
    if database.ensure_database(db):
        print(f"created the benchmark database {db['NAME']}")

    import django

    django.setup()
    from django.core.management import call_command

    from benchmarks import (
        admin_pages,
        latency,
        limits,
        recovery,
        restart,
        scaleout,
        scaling,
        schedules,
        suite,
        tasks,
        throughput,
        waiting,
        wakeup,
    )

    benchmarks = {**suite.BENCHMARKS, **scaling.BENCHMARKS, **admin_pages.BENCHMARKS,
                  **tasks.BENCHMARKS, **waiting.BENCHMARKS, **schedules.BENCHMARKS,
                  **limits.BENCHMARKS, **latency.BENCHMARKS, **wakeup.BENCHMARKS,
                  **recovery.BENCHMARKS, **restart.BENCHMARKS,
                  **scaleout.BENCHMARKS, **throughput.BENCHMARKS}

    call_command("migrate", verbosity=0, interactive=False)
    meta = describe(db, args)
    print_header(meta)

    work_dir = Path(tempfile.mkdtemp(prefix="sqlqueue-bench-"))
    ctx = suite.Context(
        db=db, vendor=database.vendor(db), seconds=args.seconds, work_dir=work_dir,
        e2e_messages=args.messages, latency_seconds=args.latency_seconds,
        idle_seconds=args.idle_seconds, profile=args.profile,
        scale_messages=args.scale_messages, scale_timeout=args.scale_timeout,
        fleet_sizes=args.fleet_sizes, admin_messages=args.admin_messages,
        admin_dead_letters=args.admin_dead_letters, task_count=args.tasks,
        baseline_task_count=args.baseline_tasks, waiting_messages=args.waiting,
        schedule_count=args.schedules, schedule_seconds=args.schedule_seconds,
        notify_seconds=args.notify_seconds, recovery_rate=args.recovery_rate,
        recovery_seconds=args.recovery_seconds, restart_down=args.restart_down,
        scaleout_messages=args.scaleout_messages,
        baseline_library=args.baseline_library,
        throughput_messages=args.throughput_messages,
    )
    results: list[suite.Result] = []
    failures: list[str] = []
    selected = [n for n in NAMES if not args.only or n in args.only]
    began = time.monotonic()
    try:
        for name in selected:
            print(f"\n== {name}", flush=True)
            t0 = time.monotonic()
            try:
                produced = benchmarks[name](ctx)
            except Exception as exc:  # noqa: BLE001 - report it, run the others
                suite.stop_workers(ctx)
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
                print(f"  FAILED: {type(exc).__name__}: {exc}", flush=True)
                results.append(suite.Result(name, None, "", details={"error": str(exc)}))
                continue
            for result in produced:
                print(f"  {result.name}: {fmt(result.value)} {result.unit}"
                      + (f" (baseline {fmt(result.baseline)})" if result.baseline else "")
                      + f"  {json.dumps(result.details)}", flush=True)
            results.extend(produced)
            print(f"  ({time.monotonic() - t0:.0f}s)", flush=True)
    finally:
        suite.stop_workers(ctx)
        ctx.empty_queue()
    meta["duration_s"] = round(time.monotonic() - began, 1)
    meta["load_average_after"] = [round(x, 2) for x in os.getloadavg()]

    print()
    print(table(results))
    print(f"\n{meta['database']}, {meta['duration_s']}s, load average "
          f"{meta['load_average_before'][0]} before, {meta['load_average_after'][0]} after")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(
            {"meta": meta, "results": [r.as_dict() for r in results]}, indent=2) + "\n")
        print(f"wrote {path}")
    if failures or args.keep_logs:
        print(f"worker logs: {work_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


def describe(db: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import django
    from django.db import connection

    from benchmarks import database
    from django_sqlqueue.conf import get_settings

    server = ""
    extra: dict[str, Any] = {}
    with connection.cursor() as cursor:
        kind = database.vendor(db)
        if kind == "mysql":
            cursor.execute("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, "
                           "@@innodb_buffer_pool_size, @@sync_binlog, @@log_bin")
            version, flush, pool, sync_binlog, log_bin = cursor.fetchone()
            server = f"MariaDB {version}" if "MariaDB" in version else f"MySQL {version}"
            extra = {"innodb_flush_log_at_trx_commit": int(flush),
                     "innodb_buffer_pool_size": int(pool), "sync_binlog": int(sync_binlog),
                     "log_bin": int(log_bin)}
        elif kind == "postgresql":
            cursor.execute("SHOW server_version")
            server = f"PostgreSQL {cursor.fetchone()[0]}"
            cursor.execute("SHOW synchronous_commit")
            extra = {"synchronous_commit": cursor.fetchone()[0]}
        else:
            cursor.execute("SELECT sqlite_version()")
            server = f"SQLite {cursor.fetchone()[0]} (WAL, synchronous=NORMAL)"
    host = db.get("HOST") or db.get("NAME")
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "database": f"{server} at {host}",
        "database_name": db["NAME"], "server_settings": extra,
        "python": platform.python_version(), "django": django.get_version(),
        "cpus": os.cpu_count(), "platform": platform.platform(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "git": git_state(),
        "sqlqueue_settings": vars(get_settings()),
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "keep_logs")},
    }


def git_state() -> dict[str, Any]:
    """The commit measured, and whether the library's files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,  # noqa: S603, S607 - git, fixed arguments
                                  text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "--short", "HEAD") or None,
            "library_modified": bool(git("status", "--porcelain", "--", "django_sqlqueue"))}


def print_header(meta: dict[str, Any]) -> None:
    print(f"django-sqlqueue benchmarks, {meta['date']}")
    print(f"  database: {meta['database']} (database {meta['database_name']}) "
          f"{meta['server_settings']}")
    print(f"  Python {meta['python']}, Django {meta['django']}, {meta['cpus']} CPUs, "
          f"{meta['platform']}")
    git = meta["git"]
    print(f"  commit {git['commit']}"
          + (" (django_sqlqueue/ has uncommitted changes)" if git["library_modified"] else ""))
    s = meta["sqlqueue_settings"]
    print(f"  SQLQUEUE: POLL_INTERVAL={s['poll_interval']} RENEW_INTERVAL={s['renew_interval']} "
          f"BATCH_SIZE={s['batch_size']} GC_INTERVAL={s['gc_interval']}")


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def fmt_ratio(ratio: float | None, target: str) -> str:
    """Two decimals, or three where two would round onto the target (0.4996 -> 0.500)."""
    if ratio is None:
        return "-"
    text = f"{ratio:.2f}"
    if target.startswith("ratio >=") and text == f"{float(target.split()[-1]):.2f}":
        text = f"{ratio:.3f}"
    return text


def table(results: list[Any]) -> str:
    header = ["benchmark", "measured", "baseline", "ratio", "target", "met?"]
    rows = [header]
    for r in results:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        if r.value is None and r.details.get("error"):
            met = "FAILED"
        elif r.value is None:
            met = "skipped"
        rows.append([
            r.name,
            f"{fmt(r.value)} {r.unit}".strip() if r.value is not None else "-",
            f"{fmt(r.baseline)} {r.unit}" if r.baseline else "-",
            fmt_ratio(r.ratio, r.target),
            r.target or "-",
            met,
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
