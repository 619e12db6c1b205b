"""Run several pytest suites at once, each against its own database, and report each
suite's outcome and wall time.

The suite is mostly waiting (worker processes, leases, polls), so the backends' runs
overlap well even on two CPUs. Each suite writes its output to a log file under
``.test-data/logs/``; a suite's log is printed whole once it ends, so runs never
interleave their lines. Used by ``make test``::

    python -m tests.matrix 'MariaDB=.venv/bin/python|mysql://root@127.0.0.1:3306/test|-m "not slow"'

Each argument is ``TITLE=PYTHON|DATABASE_URL|PYTEST ARGS`` (PYTHON and the arguments are
split as a shell would, so PYTHON may be ``env NAME=VALUE python``), or
``TITLE=!COMMAND`` for a check that is not pytest (the wheel's). A title that starts with
``@N `` (``@3 Short failover runs=!make ...``) starts its suite only once at most N of the
others still run, and ``@N:WORD `` also only once none of the others whose title holds
WORD runs or waits (``@3:MariaDB The chaos run on MariaDB``, which restarts that server):
a run whose timings mean something waits for the machine to quieten, and shares only the
tail of the matrix rather than following it. A server that cannot be
reached fails the run under CI=true and skips the suite loudly otherwise. Exits 0 when
every suite passed, else 1.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = REPO_ROOT / ".test-data" / "logs"


@dataclass
class Suite:
    title: str
    python: str
    database_url: str
    pytest_args: list[str]
    command: list[str] | None = None
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    started: float = 0.0
    outcome: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # user + system, with every process it waited for
    # Start only once at most this many other suites still run (None: at once), and none
    # whose title holds this word runs or waits to.
    start_when_running: int | None = None
    start_after: str = ""


def parse(spec: str) -> Suite:
    title, sep, rest = spec.partition("=")
    title, waits, after = title.strip(), None, ""
    if title.startswith("@"):
        condition, _, title = title[1:].partition(" ")
        count, _, after = condition.partition(":")
        if not count.isdigit() or not title.strip():
            raise SystemExit(f"matrix: bad suite {spec!r}: expected '@N[:WORD] TITLE=...'")
        title, waits = title.strip(), int(count)
    if sep and rest.startswith("!"):
        return Suite(title, "", "", [], command=shlex.split(rest[1:]), start_when_running=waits,
                     start_after=after)
    parts = rest.split("|", 2)
    if not sep or len(parts) < 2:
        raise SystemExit(f"matrix: bad suite {spec!r}: expected TITLE=PYTHON|DATABASE_URL|PYTEST ARGS")
    args = shlex.split(parts[2]) if len(parts) > 2 else []
    return Suite(title, parts[0].strip(), parts[1].strip(), args, start_when_running=waits,
                 start_after=after)


def may_start(suite: Suite, running: list[Suite], deferred: list[Suite]) -> bool:
    """Whether a deferred suite's condition holds (see the module docstring)."""
    assert suite.start_when_running is not None
    others = [s for s in running + deferred if s is not suite]
    return (len(running) <= suite.start_when_running
            and not any(suite.start_after in s.title for s in others if suite.start_after))


def is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def unreachable(suite: Suite, env: dict[str, str]) -> str | None:
    """Why the suite's database server cannot be reached, or None."""
    if suite.command is not None or suite.database_url.startswith("sqlite"):
        return None
    probe = subprocess.run(
        [*shlex.split(suite.python), "-m", "tests.backends"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, check=False,
    )
    if probe.returncode == 0:
        return None
    return (probe.stdout + probe.stderr).strip() or f"exit {probe.returncode}"


def start(suite: Suite) -> None:
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    if suite.database_url:
        env["DATABASE_URL"] = suite.database_url
    reason = unreachable(suite, env)
    if reason is not None:
        suite.outcome = "UNREACHABLE" if is_ci() else "SKIPPED"
        print(f"matrix: {suite.title}: {reason}"
              + (" -- CI=true requires every backend" if is_ci() else " (skipped)"), flush=True)
        return
    slug = "".join(c if c.isalnum() else "-" for c in suite.title.lower()).strip("-")
    suite.log = LOG_DIR / f"{slug}.log"
    command = suite.command or [*shlex.split(suite.python), "-m", "pytest", *suite.pytest_args]
    if suite.command is None:  # each test file's time, for tests/shard.py (make test-durations)
        env["SQLQUEUE_TEST_TIMES"] = str(LOG_DIR / f"{slug}.times.json")
    print(f"matrix: {suite.title}: started ({suite.database_url or shlex.join(command)})",
          flush=True)
    suite.started = time.monotonic()
    with suite.log.open("wb") as out:
        out.write(f"$ DATABASE_URL={suite.database_url} {shlex.join(command)}\n".encode())
        out.flush()
        suite.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)


def finish(suite: Suite, returncode: int, cpu_seconds: float) -> None:
    suite.seconds = time.monotonic() - suite.started
    suite.cpu_seconds = cpu_seconds
    suite.outcome = "ok" if returncode == 0 else f"FAILED(exit-{returncode})"
    print(f"\n==================== {suite.title}: {suite.outcome} in {suite.seconds:.0f} s "
          f"({cpu_seconds:.0f} s of CPU) ====================", flush=True)
    assert suite.log is not None
    sys.stdout.write(suite.log.read_text(errors="replace"))
    sys.stdout.flush()


SERVERS = {"mariadbd": "MariaDB", "mysqld": "MySQL", "postgres": "PostgreSQL"}


def server_cpu() -> dict[str, float]:
    """CPU seconds the database servers have used so far (Linux; empty elsewhere):
    their processes' own and that of the exited ones they reaped (PostgreSQL's sessions)."""
    used: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        name = text[text.index("(") + 1:text.rindex(")")]
        if name in SERVERS:
            fields = text[text.rindex(")") + 2:].split()
            # utime, stime, cutime, cstime: fields 14-17 of proc(5), 12-15 after the name.
            used[SERVERS[name]] = used.get(SERVERS[name], 0.0) + sum(
                int(f) for f in fields[11:15]) / tick
    return used


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / tick, sum(values) / tick


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    suites = [parse(spec) for spec in argv]
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    servers_before, busy_before = server_cpu(), machine_busy()
    deferred = [s for s in suites if s.start_when_running is not None]
    for suite in suites:
        if suite not in deferred:
            start(suite)
    running = [s for s in suites if s.process is not None]
    try:
        while running or deferred:
            for suite in list(deferred):
                if may_start(suite, running, deferred):
                    deferred.remove(suite)
                    start(suite)
                    if suite.process is not None:
                        running.append(suite)
            for suite in list(running):
                assert suite.process is not None
                # wait4 rather than poll(): it also tells the CPU the suite used, its worker
                # processes and Spark's JVM included (what the two CPUs are shared out by).
                pid, status, usage = os.wait4(suite.process.pid, os.WNOHANG)
                if pid:
                    suite.process.returncode = os.waitstatus_to_exitcode(status)
                    running.remove(suite)
                    finish(suite, suite.process.returncode, usage.ru_utime + usage.ru_stime)
            time.sleep(0.5)
    except KeyboardInterrupt:
        for suite in running:
            assert suite.process is not None
            suite.process.terminate()
        raise
    print(f"\nmatrix: {len(suites)} suites in {time.monotonic() - began:.0f} s:")
    for suite in suites:
        took = f" {suite.seconds:.0f} s ({suite.cpu_seconds:.0f} s of CPU)" if suite.seconds else ""
        print(f"  {suite.title}: {suite.outcome}{took}")
    servers_after, busy_after = server_cpu(), machine_busy()
    for name, seconds in sorted(servers_after.items()):
        used = seconds - servers_before.get(name, 0.0)
        # Less than before: the server was restarted meanwhile (the chaos run does that).
        print(f"  {name} server: {used:.0f} s of CPU" if used >= 0 else
              f"  {name} server: restarted meanwhile, {seconds:.0f} s of CPU since")
    busy, total = busy_after[0] - busy_before[0], busy_after[1] - busy_before[1]
    if total > 0:
        print(f"  the machine: {busy:.0f} s of CPU busy of {total:.0f} ({busy / total:.0%})")
    failed = [s for s in suites if s.outcome not in ("ok", "SKIPPED")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
