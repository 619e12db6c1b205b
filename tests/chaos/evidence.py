"""What the processes of a chaos run wrote down, read back into plain objects.

The publishers say what they stored (each row, with its transaction's commit window), the
handlers what they ran, the orchestrator which faults it applied and what it saw of them,
and the workers what they observed themselves (their clock, leases they lost). See
``records.py`` for how each line is written, ``report.py`` and ``verify.py`` for what is
checked. Every time is ``time.monotonic()``, one clock for every process of the machine.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import records


@dataclass
class Transaction:
    """A committed publishing transaction: it committed between ``begin`` (just before the
    commit was asked for; the first try's, when it was retried) and ``end`` (the commit
    returned)."""

    ident: str
    begin: float
    end: float


@dataclass
class Stored:
    """One row a committed transaction stored: a message, or a re-publish stored anew."""

    offset: int
    n: int  # the message number in its payload (a re-publish carries its original's)
    key: str
    tx: str  # Transaction.ident
    index: int  # its place among the messages its transaction published
    flag: str = ""  # poison, flaky, slow, hang or ''


@dataclass
class Published:
    rows: dict[int, Stored] = field(default_factory=dict)  # offset -> row
    transactions: dict[str, Transaction] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)  # message numbers
    rolled_back: set[int] = field(default_factory=set)
    flags: dict[int, str] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # number -> offset first stored
    # Re-publishes of committed ids: (number, first offset, offset publish returned, the
    # offset of the row stored under that id just before, or None when GC had collected it).
    republished: list[tuple[int, int, int, int | None]] = field(default_factory=list)
    retries: int = 0  # transactions retried after a database fault

    @property
    def duplicates(self) -> int:
        return len(self.republished)

    def add(self, tx: Transaction, messages: list[tuple[int, str, int]],
            flags: dict[int, str] | None = None) -> None:
        """Record a committed transaction's messages: (number, key, offset) in publish order."""
        self.transactions[tx.ident] = tx
        self.flags.update(flags or {})
        for index, (n, key, offset) in enumerate(messages):
            self.committed.add(n)
            self.offsets.setdefault(n, offset)
            self.rows.setdefault(offset, Stored(offset, n, key, tx.ident, index,
                                                self.flags.get(n, "")))

    def add_republish(self, tx: str, n: int, key: str, first: int, again: int,
                      existed: int | None, index: int) -> None:
        self.republished.append((n, first, again, existed))
        if again not in self.rows:  # stored anew: a row of its own, to be handled
            self.rows[again] = Stored(again, n, key, tx, index, self.flags.get(n, ""))


@dataclass
class Run:
    group: str
    n: int
    offset: int
    key: str
    position: int
    attempt: int
    pid: int
    start: float
    end: float | None = None  # None: never finished (killed, hung, or still running)
    ok: bool = False
    partition: str = ""
    thread: int = 0


@dataclass
class Faults:
    kills: dict[int, float] = field(default_factory=dict)  # pid -> when it was dead (reaped)
    # pid -> when SIGKILL was sent: the process may still write a record or two until it
    # is dead, so a kill spans (sent, dead).
    kills_sent: dict[int, float] = field(default_factory=dict)
    kill_codes: dict[int, int | None] = field(default_factory=dict)  # pid -> exit status seen
    kills_skipped: int = 0  # scheduled kills with no worker that could be killed
    pauses: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    pause_states: list[str] = field(default_factory=list)  # /proc state seen after SIGSTOP
    db_outages: list[tuple[float, float]] = field(default_factory=list)
    # The server before and after each restart: {"started": epoch s, "pid": ...}.
    restarts: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    locks: list[dict[str, Any]] = field(default_factory=list)  # lock holder reports
    lease_losses: dict[tuple[int, str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list))  # (pid, group, partition) -> when logged
    acks: dict[tuple[int, str, int], list[float]] = field(
        default_factory=lambda: defaultdict(list))  # (pid, group, offset) -> acks committed
    skewed: set[int] = field(default_factory=set)  # pids of workers started with a skew
    clock: tuple[float, float] | None = None  # the orchestrator's (monotonic, wall)
    # Worker clock readings: (pid, monotonic, wall, database clock in epoch seconds or None).
    clocks: list[tuple[int, float, float, float | None]] = field(default_factory=list)
    not_exercised: dict[str, str] = field(default_factory=dict)  # fault -> why
    stopped_at: float = math.inf  # when the workers were stopped at the end
    started: dict[int, float] = field(default_factory=dict)  # worker pid -> when started
    # Each failover: (when the writer was made to fail, when clients reached the new one,
    # the writer before, the new writer, the old writer afterwards), servers as
    # ``clusters`` describes them ({"node": ..., "port": ..., "pid": ..., "running": ...}).
    failovers: list[tuple[float, float, dict[str, Any], dict[str, Any], dict[str, Any]]] = \
        field(default_factory=list)
    # PostgreSQL's wake-up listeners found on the new primary after the drain, and the
    # workers running then: (listeners, workers).
    listeners: tuple[int, int] | None = None

    def killed_within(self, pid: int, since: float, until: float) -> bool:
        dead = self.kills.get(pid)
        if dead is None:
            return False
        return self.kills_sent.get(pid, dead) <= until and dead >= since

    def paused_within(self, pid: int, since: float, until: float) -> bool:
        return any(a <= until and b >= since for a, b in self.pauses.get(pid, []))

    def outage_within(self, since: float, until: float) -> bool:
        return any(a <= until and b >= since for a, b in self.db_outages)

    def lease_lost_within(self, pid: int, group: str, partition: str, since: float,
                          until: float) -> bool:
        return any(since <= at <= until
                   for at in self.lease_losses.get((pid, group, partition), []))

    def acked_after(self, run: Run) -> float | None:
        """When the worker of ``run`` committed an ack of its row after the run began."""
        times = [t for t in self.acks.get((run.pid, run.group, run.offset), []) if t >= run.start]
        return min(times) if times else None

    def live_end(self, run: Run) -> float:
        """When the run stopped handling: its end, its worker's death, or never (hung)."""
        if run.end is not None:
            return run.end
        return self.kills.get(run.pid, self.stopped_at)


# --------------------------------------------------------------------------- reading


def read_published(directory: Path) -> Published:
    published = Published()
    events = list(records.read(directory, "published"))
    for r in events:
        if r["e"] == "committed":
            tx = Transaction(f"{r['p']}:{r['tx']}", r["c0"], r["c1"])
            flags = {int(n): flag for n, flag in r.get("flags", {}).items()}
            published.add(tx, list(zip(r["ns"], r["keys"], r["offsets"], strict=True)), flags)
        elif r["e"] == "rolled_back":
            published.rolled_back.update(r["ns"])
        elif r["e"] == "retry":
            published.retries += 1
    for r in events:  # after every committed row is known
        if r["e"] == "duplicate":
            published.add_republish(f"{r['p']}:{r['tx']}", r["n"], r["k"], r["offset"],
                                    r["again"], r["existed"], r["i"])
    return published


def read_runs(directory: Path) -> list[Run]:
    open_runs: dict[tuple[int, str, int, int], list[Run]] = defaultdict(list)
    runs: list[Run] = []
    for r in records.read(directory, "runs"):
        ident = (r["p"], r["g"], r["o"], r["a"])
        if r["e"] == "start":
            run = Run(r["g"], r["n"], r["o"], r["k"], r["pos"], r["a"], r["p"], r["t"],
                      partition=str(r.get("part", "")), thread=r.get("th", 0))
            open_runs[ident].append(run)
            runs.append(run)
        elif r["e"] == "end" and open_runs[ident]:
            run = open_runs[ident].pop(0)
            run.end, run.ok = r["t"], bool(r["ok"])
    return runs


def read_faults(directory: Path) -> Faults:
    faults = Faults()
    paused_since: dict[int, float] = {}
    down: dict[str, Any] | None = None
    failing: dict[str, Any] | None = None
    for r in sorted(records.read(directory, "faults"), key=lambda r: r["t"]):
        e = r["e"]
        if e == "start":
            faults.started[r["pid"]] = r["t"]
            if r.get("skewed"):
                faults.skewed.add(r["pid"])
        elif e == "failover_down":
            failing = r
        elif e == "failover_up" and failing is not None:
            # Clients could not write meanwhile: an outage, as a restart is.
            faults.db_outages.append((failing["t"], r["t"]))
            faults.failovers.append((failing["t"], r["t"], failing.get("server", {}),
                                     r.get("server", {}), r.get("old", {})))
            failing = None
        elif e == "listeners":
            faults.listeners = (r["n"], r["workers"])
        elif e == "kill_skipped":
            faults.kills_skipped += 1
        elif e == "kill":
            faults.kills_sent[r["pid"]] = r["t"]
            faults.kills[r["pid"]] = r.get("dead", r["t"])
            faults.kill_codes[r["pid"]] = r.get("code")
        elif e == "stop":
            paused_since[r["pid"]] = r["t"]
            faults.pause_states.append(r.get("state", ""))
        elif e == "cont" and r["pid"] in paused_since:
            faults.pauses[r["pid"]].append((paused_since.pop(r["pid"]), r["t"]))
        elif e == "db_down":
            down = r
        elif e == "db_up" and down is not None:
            faults.db_outages.append((down["t"], r["t"]))
            faults.restarts.append((down.get("server", {}), r.get("server", {})))
            down = None
        elif e == "unlock":
            faults.locks.append(r)
        elif e == "clock":
            faults.clock = (r["t"], r["wall"])
        elif e == "not_exercised":
            faults.not_exercised[r["fault"]] = r["why"]
        elif e == "workers_stopped":
            faults.stopped_at = r["t"]
    if failing is not None:  # failed over, and no new writer ever answered
        faults.db_outages.append((failing["t"], math.inf))
        faults.failovers.append((failing["t"], math.inf, failing.get("server", {}), {}, {}))
    if down is not None:  # stopped, never seen up again
        faults.db_outages.append((down["t"], math.inf))
        faults.restarts.append((down.get("server", {}), {}))
    for r in records.read(directory, "observed"):
        if r["e"] == "lease_lost":
            faults.lease_losses[(r["p"], r["g"], str(r["part"]))].append(r["t"])
        elif r["e"] == "acked":
            faults.acks[(r["p"], r["g"], r["o"])].append(r["t"])
        elif r["e"] == "clock":
            faults.clocks.append((r["p"], r["t"], r["wall"], r.get("db")))
    return faults
