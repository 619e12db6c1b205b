"""Did each fault take effect, and did any process log a bug?

A fault that was applied but shows no effect fails the run; one that cannot be applied
here (SQLite has no server to restart) is reported as not exercised, with the reason, and
never passes silently as if it had been. Tracebacks and ERROR lines in the processes' logs
fail the run, except the kinds named in ``EXPECTED_LOG_LINES``, each with its reason.
"""

from __future__ import annotations

import math
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from .evidence import Faults, Published, Run

SKEW_TOLERANCE = 5.0  # seconds a clock reading may differ from the skew intended
LOCK_TOLERANCE = 0.5  # seconds the lock may be held less than intended

# Log lines that are not bugs: (pattern, why). Matched against a traceback's last line
# (the exception) or an ERROR line. Keep this short: each entry hides a kind of failure.
EXPECTED_LOG_LINES: tuple[tuple[str, str], ...] = (
    (r"dead-lettering a message its worker cannot handle .*payload is nested too deeply",
     "the poison publisher's too deep payloads, dead-lettered as they must be"),
    (r"IdleInTransactionSessionTimeout|idle-in-transaction timeout",
     "PostgreSQL ends the open transaction of the worker paused past its lease"),
)


@dataclass
class FaultCheck:
    fault: str
    applied: int
    status: str  # "verified", "not exercised" or "FAILED"
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "FAILED"


@dataclass
class Plan:
    """What the run meant to do."""

    kills: int
    pauses: int
    pause_seconds: float
    skew_seconds: float
    lock_seconds: float
    max_handler_time: float
    vendor: str
    failover: str = ""  # "pg" or "galera": the writer fails over instead of restarting
    lease: float = 10.0  # seconds, LEASE_DURATION
    retry_delay: float = 5.0  # seconds, the longest wait of a worker between two retries


def check_faults(plan: Plan, faults: Faults, runs: list[Run], published: Published,
                 groups: tuple[str, ...]) -> list[FaultCheck]:
    server = [_failover(plan, faults), _resumed(plan, faults, runs)] if plan.failover \
        else [_restart(faults)]
    if plan.failover == "pg":
        server.append(_listeners(faults))
    return [
        _kills(plan, faults), _pauses(plan, faults), _skew(plan, faults),
        _lock(plan, faults), *server, _hang(plan, faults, runs, published, groups),
        FaultCheck("rolled-back transactions", len(published.rolled_back),
                   "verified" if published.rolled_back else "FAILED",
                   "" if published.rolled_back else "no publishing transaction rolled back"),
    ]


def _kills(plan: Plan, faults: Faults) -> FaultCheck:
    codes = list(faults.kill_codes.values())
    wrong = [c for c in codes if c != -signal.SIGKILL]
    if wrong or len(codes) + faults.kills_skipped < plan.kills or not codes:
        return FaultCheck("kill -9", len(codes), "FAILED",
                          f"{len(codes)} of {plan.kills} kills applied; exit statuses "
                          f"other than SIGKILL: {wrong}")
    skipped = (f"; {faults.kills_skipped} skipped: no live worker that may be killed"
               if faults.kills_skipped else "")
    return FaultCheck("kill -9", len(codes), "verified", f"every one exited by SIGKILL{skipped}")


def _pauses(plan: Plan, faults: Faults) -> FaultCheck:
    spans = [b - a for ps in faults.pauses.values() for a, b in ps]
    stopped = [s for s in faults.pause_states if s == "T"]
    if len(spans) < plan.pauses or len(stopped) < plan.pauses \
            or any(s < plan.pause_seconds - 1 for s in spans):
        return FaultCheck("SIGSTOP pause", len(spans), "FAILED",
                          f"{len(spans)} of {plan.pauses} pauses, process states seen "
                          f"{faults.pause_states}, lengths {[round(s, 1) for s in spans]} s")
    return FaultCheck("SIGSTOP pause", len(spans), "verified",
                      f"process seen stopped (state T) for {min(spans, default=0):.1f} s")


def _skew(plan: Plan, faults: Faults) -> FaultCheck:
    """The skewed worker's wall clock, against the orchestrator's at the same monotonic
    time, must be ``plan.skew_seconds`` ahead; every other worker's must not be."""
    if faults.clock is None:
        return FaultCheck("clock skew", 0, "FAILED", "the orchestrator recorded no clock")
    mono0, wall0 = faults.clock
    skewed: list[float] = []
    straight: list[float] = []
    against_db: list[float] = []
    for pid, mono, wall, db in faults.clocks:
        skew = (wall - mono) - (wall0 - mono0)
        (skewed if pid in faults.skewed else straight).append(skew)
        if pid in faults.skewed and db is not None:
            against_db.append(wall - db)
    wrong = [round(s, 1) for s in straight if abs(s) > SKEW_TOLERANCE]
    if not skewed or any(abs(s - plan.skew_seconds) > SKEW_TOLERANCE for s in skewed) or wrong:
        return FaultCheck("clock skew", len(skewed), "FAILED",
                          f"skewed worker readings {[round(s, 1) for s in skewed[:5]]} s "
                          f"(intended {plan.skew_seconds:+g} s); other workers off by {wrong[:5]}")
    detail = f"skewed worker's wall clock {min(skewed):+.1f} s ({len(skewed)} readings)"
    if against_db:
        db_skew = min(against_db)
        detail += f", {db_skew:+.1f} s against the database clock"
        if plan.vendor == "sqlite":
            detail += (" (SQLite's clock is the process's own: that worker's database "
                       "clock ran ahead with it)")
    return FaultCheck("clock skew", len(skewed), "verified", detail)


def _lock(plan: Plan, faults: Faults) -> FaultCheck:
    if "lock" in faults.not_exercised:
        return FaultCheck("idle transaction's lock", 0, "not exercised",
                          faults.not_exercised["lock"])
    if not faults.locks:
        return FaultCheck("idle transaction's lock", 0, "FAILED", "the lock holder reported nothing")
    lock = faults.locks[0]
    # An error after the lock was held its whole time is the end of its connection (on a
    # loaded machine the fault can run into a failover): the fault took effect all the same.
    if lock.get("offset") is None or not lock.get("probed") \
            or lock.get("held", 0) < plan.lock_seconds - LOCK_TOLERANCE:
        return FaultCheck("idle transaction's lock", 1, "FAILED",
                          f"row {lock.get('offset')}, locked as seen from another connection: "
                          f"{lock.get('probed')}, held {lock.get('held')} s of "
                          f"{plan.lock_seconds:g}, error {lock.get('error')!r}")
    ended = f"; its connection then failed: {lock['error']!r}" if lock.get("error") else ""
    return FaultCheck("idle transaction's lock", 1, "verified",
                      f"row {lock['offset']} held {lock['held']:.1f} s, another connection's "
                      f"NOWAIT read found it locked{ended}")


def _restart(faults: Faults) -> FaultCheck:
    if "restart_db" in faults.not_exercised:
        return FaultCheck("database restart", 0, "not exercised",
                          faults.not_exercised["restart_db"])
    if not faults.restarts:
        return FaultCheck("database restart", 0, "FAILED", "no restart was recorded")
    for before, after in faults.restarts:
        moved = after.get("started", 0) > before.get("started", 0)
        pid_ok = not (before.get("pid") and after.get("pid")) or before["pid"] != after["pid"]
        if not (moved and pid_ok):
            return FaultCheck("database restart", len(faults.restarts), "FAILED",
                              f"server before {before}, after {after}: it did not restart")
    before, after = faults.restarts[0]
    down = max((b - a for a, b in faults.db_outages), default=0.0)
    pids = f", pid {before['pid']} -> {after['pid']}" if before.get("pid") else ""
    return FaultCheck("database restart", len(faults.restarts), "verified",
                      f"server start time moved {after['started'] - before['started']:.0f} s"
                      f"{pids}; unreachable {down:.1f} s")


def _failover(plan: Plan, faults: Faults) -> FaultCheck:
    """The writer before must have been one and be gone, and another server must have
    answered as the writer."""
    name = "failover (PostgreSQL promotion)" if plan.failover == "pg" \
        else "failover (Galera node killed)"
    if not faults.failovers:
        return FaultCheck(name, 0, "FAILED", "no failover was recorded")
    down, up, before, after, old = faults.failovers[0]
    writer = "primary" if plan.failover == "pg" else "synced"
    if not (before.get(writer) and after.get(writer) and after.get("node") != before.get("node")
            and old.get("running") is False):
        return FaultCheck(name, len(faults.failovers), "FAILED",
                          f"writer before {before}, after {after}, the old one afterwards {old}")
    how = "stopped -m immediate" if plan.failover == "pg" else "killed -9"
    return FaultCheck(name, len(faults.failovers), "verified",
                      f"{before['node']} (port {before['port']}, pid {before['pid']}) {how}, "
                      f"{after['node']} (port {after['port']}) the writer "
                      f"{up - down:.1f} s later")


def resume_gaps(faults: Faults, runs: list[Run]) -> tuple[float, dict[int, float | None]]:
    """After the first failover: (when clients could write again, seconds from the
    writer's failure), and per worker that ran before it and was not killed before running
    again, seconds from the failure to its first handler run after it (None: never)."""
    down, up = faults.failovers[0][:2]
    first: dict[int, float] = {}
    for run in runs:
        if run.start > down and run.start < first.get(run.pid, math.inf):
            first[run.pid] = run.start
    gaps: dict[int, float | None] = {}
    for pid, started in faults.started.items():
        killed = faults.kills_sent.get(pid, math.inf)
        if started >= down or killed <= down:
            continue  # not running when the writer failed
        resumed = first.get(pid)
        if resumed is None and killed < math.inf:
            continue  # killed later, before it ran anything
        if resumed is not None and resumed > killed:
            continue
        gaps[pid] = None if resumed is None else resumed - down
    return up - down, gaps


def _resumed(plan: Plan, faults: Faults, runs: list[Run]) -> FaultCheck:
    """Every worker running through the failover must start handlers again within the
    outage + LEASE_DURATION + its longest wait between two retries."""
    name = "workers resumed after the failover"
    if not faults.failovers:
        return FaultCheck(name, 0, "FAILED", "no failover was recorded")
    outage, gaps = resume_gaps(faults, runs)
    bound = outage + plan.lease + plan.retry_delay
    never = [pid for pid, gap in gaps.items() if gap is None]
    late = {pid: round(gap, 1) for pid, gap in gaps.items() if gap is not None and gap > bound}
    measured = [gap for gap in gaps.values() if gap is not None]
    detail = (f"{len(gaps)} workers; first handler run {min(measured, default=math.inf):.1f} s "
              f"after the writer failed, every worker's within {max(measured, default=0):.1f} s "
              f"(bound: outage {outage:.1f} s + lease {plan.lease:g} s + retry wait "
              f"{plan.retry_delay:g} s = {bound:.1f} s)")
    if not gaps or never or late:
        return FaultCheck(name, len(gaps), "FAILED",
                          f"{detail}; never resumed: pids {never}; late: {late}")
    return FaultCheck(name, len(gaps), "verified", detail)


def _listeners(faults: Faults) -> FaultCheck:
    """Every worker's wake-up listener must be connected to the new primary."""
    name = "wake-up listeners on the new primary"
    if faults.listeners is None:
        return FaultCheck(name, 0, "FAILED", "the listeners were not counted")
    found, workers = faults.listeners
    status = "verified" if workers and found >= workers else "FAILED"
    return FaultCheck(name, found, status,
                      f"{found} listener connection(s) for {workers} running workers")


def _hang(plan: Plan, faults: Faults, runs: list[Run], published: Published,
          groups: tuple[str, ...]) -> FaultCheck:
    """In each group the hung message's first run must outlive MAX_HANDLER_TIME, and the
    message must then be handled by another run."""
    hung = {n for n, flag in published.flags.items() if flag == "hang"}
    hung_in, short = [], []
    for group in groups:
        rs = [r for r in runs if r.group == group and r.n in hung]
        first = [r for r in rs if r.attempt == 1 and not r.ok]
        lived = max((faults.live_end(r) - r.start for r in first), default=0.0)
        if lived >= plan.max_handler_time and any(r.ok and r.attempt > 1 for r in rs):
            hung_in.append(group)
        else:
            short.append(f"{group} (first run lived {lived:.1f} s)")
    if short:
        return FaultCheck("hung handler", len(hung_in), "not exercised",
                          "in " + ", ".join(short) + f": its worker was killed or stopped "
                          f"before MAX_HANDLER_TIME ({plan.max_handler_time:g} s)")
    return FaultCheck("hung handler", len(hung_in), "verified",
                      f"outlived MAX_HANDLER_TIME and was redelivered in {', '.join(hung_in)}")


# --------------------------------------------------------------------------- logs


TRACEBACK = "Traceback (most recent call last):"
ERROR_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) ")


def log_problems(directory: Path) -> tuple[list[str], dict[str, int]]:
    """Tracebacks and ERROR lines in the processes' logs: (unexpected ones, each with its
    file, and a count of the expected ones per reason)."""
    unexpected: list[str] = []
    expected: dict[str, int] = {}
    for path in sorted([*directory.glob("worker-*.log"), *directory.glob("publisher-*.log")]):
        for line in _notable(path.read_text(errors="replace").splitlines()):
            reason = next((why for pattern, why in EXPECTED_LOG_LINES
                           if re.search(pattern, line)), None)
            if reason is None:
                unexpected.append(f"{path.name}: {line[:300]}")
            else:
                expected[reason] = expected.get(reason, 0) + 1
    return unexpected, expected


def _notable(lines: list[str]) -> list[str]:
    """Each traceback, as ``Traceback: <its exception line>``, and each ERROR line."""
    found = []
    in_traceback = False
    for line in lines:
        if line.startswith(TRACEBACK):
            in_traceback = True
        elif in_traceback and line and not line.startswith((" ", "\t")) \
                and not line.startswith(("During handling", "The above exception")):
            found.append(f"Traceback: {line}")
            in_traceback = False
        elif not in_traceback and ERROR_LINE.match(line):
            found.append(line)
    return found
