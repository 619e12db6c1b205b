"""What a chaos run did to each consumer group: lost, duplicated, reordered, overlapped.

Read from the records the processes wrote (see ``records.py``) and from the database
(dead-letter copies, watermarks). Every count that must be 0 is checked by
:meth:`GroupReport.failures`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import records

GROUPS = ("ledger", "strict", "audit")
STRICT_GROUP = "strict"
TIMEOUT_GROUP = "audit"  # no auto-extension: a slow first run outlives its visibility
# Seconds between a handler's end and its ack being committed, within which a fault that
# hits its worker explains a redelivery (the next poll cycle records the ack).
ACK_SLACK = 3.0


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


@dataclass
class Faults:
    kills: dict[int, float] = field(default_factory=dict)  # pid -> when it was killed
    pauses: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    db_outages: list[tuple[float, float]] = field(default_factory=list)
    stopped_at: float = math.inf  # when the workers were stopped at the end

    def killed_within(self, pid: int, since: float, until: float) -> bool:
        at = self.kills.get(pid)
        return at is not None and since <= at <= until

    def paused_within(self, pid: int, since: float, until: float) -> bool:
        return any(a <= until and b >= since for a, b in self.pauses.get(pid, []))

    def outage_within(self, since: float, until: float) -> bool:
        return any(a <= until and b >= since for a, b in self.db_outages)

    def live_end(self, run: Run) -> float:
        """When the run stopped handling: its end, its worker's death, or never (hung)."""
        if run.end is not None:
            return run.end
        return self.kills.get(run.pid, self.stopped_at)


@dataclass
class Published:
    committed: set[int] = field(default_factory=set)
    rolled_back: set[int] = field(default_factory=set)
    flags: dict[int, str] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # number -> offset stored
    # Re-publishes of committed ids: (number, first offset, offset publish returned, the
    # offset of the row stored under that id just before, or None when GC had collected it).
    republished: list[tuple[int, int, int, int | None]] = field(default_factory=list)
    retries: int = 0  # transactions retried after a database fault

    @property
    def duplicates(self) -> int:
        return len(self.republished)

    @property
    def poison(self) -> set[int]:
        return {n for n, flag in self.flags.items() if flag == "poison"} & self.committed


def read_published(directory: Path) -> Published:
    published = Published()
    for r in records.read(directory, "published"):
        if r["e"] == "committed":
            published.committed.update(r["ns"])
            published.flags.update({int(n): flag for n, flag in r.get("flags", {}).items()})
            published.offsets.update(zip(r["ns"], r.get("offsets", []), strict=False))
        elif r["e"] == "rolled_back":
            published.rolled_back.update(r["ns"])
        elif r["e"] == "duplicate":
            published.republished.append((r["n"], r["offset"], r["again"], r["existed"]))
        elif r["e"] == "retry":
            published.retries += 1
    return published


def read_runs(directory: Path) -> list[Run]:
    open_runs: dict[tuple[int, str, int, int], list[Run]] = defaultdict(list)
    runs: list[Run] = []
    for r in records.read(directory, "runs"):
        ident = (r["p"], r["g"], r["n"], r["a"])
        if r["e"] == "start":
            run = Run(r["g"], r["n"], r["o"], r["k"], r["pos"], r["a"], r["p"], r["t"])
            open_runs[ident].append(run)
            runs.append(run)
        elif r["e"] == "end" and open_runs[ident]:
            run = open_runs[ident].pop(0)
            run.end, run.ok = r["t"], bool(r["ok"])
    return runs


def read_faults(directory: Path) -> Faults:
    faults = Faults()
    paused_since: dict[int, float] = {}
    down_since: float | None = None
    for r in sorted(records.read(directory, "faults"), key=lambda r: r["t"]):
        if r["e"] == "kill":
            faults.kills[r["pid"]] = r["t"]
        elif r["e"] == "stop":
            paused_since[r["pid"]] = r["t"]
        elif r["e"] == "cont" and r["pid"] in paused_since:
            faults.pauses[r["pid"]].append((paused_since.pop(r["pid"]), r["t"]))
        elif r["e"] == "db_down":
            down_since = r["t"]
        elif r["e"] == "db_up" and down_since is not None:
            faults.db_outages.append((down_since, r["t"]))
            down_since = None
        elif r["e"] == "workers_stopped":
            faults.stopped_at = r["t"]
    return faults


@dataclass
class GroupReport:
    group: str
    published: int = 0
    handled: int = 0
    lost: list[int] = field(default_factory=list)
    rolled_back_handled: list[int] = field(default_factory=list)
    duplicates: int = 0
    duplicates_explained: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    duplicates_unexplained: list[int] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    dead_letters: int = 0
    poison: int = 0
    dead_letters_unexplained: list[int] = field(default_factory=list)
    poison_missing: list[int] = field(default_factory=list)
    overlaps_explained: int = 0
    overlaps: list[str] = field(default_factory=list)
    lag: int = -1

    def failures(self) -> list[str]:
        found = []
        for label, items in (
            ("lost", self.lost),
            ("handled although rolled back", self.rolled_back_handled),
            ("duplicates no crash or timeout explains", self.duplicates_unexplained),
            ("order violations", self.order_violations),
            ("dead letters that are not poison", self.dead_letters_unexplained),
            ("poison messages missing from the dead-letter topic", self.poison_missing),
            ("two live workers handling one key at once", self.overlaps),
        ):
            if items:
                found.append(f"{self.group}: {len(items)} {label}, e.g. {sorted(items)[:5]}")
        if self.lag != 0:
            found.append(f"{self.group}: final lag {self.lag}, expected 0")
        return found


def analyse(group: str, published: Published, runs: list[Run], faults: Faults,
            dead_letters: set[int], lag: int) -> GroupReport:
    report = GroupReport(group, published=len(published.committed), lag=lag)
    mine = [r for r in runs if r.group == group]
    by_message: dict[int, list[Run]] = defaultdict(list)  # stored message (offset) -> runs
    for run in sorted(mine, key=lambda r: r.start):
        by_message[run.offset].append(run)
    succeeded = {run.n for run in mine if run.ok}
    report.handled = len(published.committed & (succeeded | dead_letters))
    report.lost = sorted(published.committed - succeeded - dead_letters)
    report.rolled_back_handled = sorted(published.rolled_back & {run.n for run in mine})
    for rs in by_message.values():
        successes = [r for r in rs if r.ok]
        for later in successes[1:]:
            report.duplicates += 1
            reason = _why_again(later, rs, published, faults)
            if reason:
                report.duplicates_explained[reason] += 1
            else:
                report.duplicates_unexplained.append(later.n)
    poison = published.poison
    report.dead_letters = len(dead_letters)
    report.poison = len(poison)
    report.dead_letters_unexplained = sorted(dead_letters - poison)
    report.poison_missing = sorted(poison - dead_letters)
    if group == STRICT_GROUP:
        report.order_violations = _order_violations(mine)
    report.overlaps, report.overlaps_explained = _overlaps(mine, published, faults)
    return report


def _timed_out(run: Run, published: Published) -> bool:
    """The run outlived its message's visibility by design (a hang, or a slow run in the
    group that does not extend visibility)."""
    flag = published.flags.get(run.n)
    if run.attempt != 1:
        return False
    return flag == "hang" or (flag == "slow" and run.group == TIMEOUT_GROUP)


def _why_again(later: Run, runs: Iterable[Run], published: Published, faults: Faults) -> str:
    """Why ``later`` ran although an earlier run had succeeded or was under way; '' if
    nothing explains it."""
    for earlier in runs:
        if earlier is later or earlier.start >= later.start:
            continue
        if _timed_out(earlier, published):
            return "timeout"
        if earlier.end is None:
            return "worker killed mid-run"
        if faults.killed_within(earlier.pid, earlier.start, earlier.end + ACK_SLACK):
            return "worker killed before the ack"
        if faults.paused_within(earlier.pid, earlier.start, earlier.end + ACK_SLACK):
            return "worker paused past its lease"
        if faults.outage_within(earlier.start, earlier.end + ACK_SLACK):
            return "database restart"
    return ""


def _order_violations(runs: list[Run]) -> list[str]:
    """Per key, handler starts must follow log positions: nothing of a key starts before
    an earlier message of it has been acked (or dead-lettered)."""
    violations = []
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    for key, rs in by_key.items():
        highest = 0
        for run in sorted(rs, key=lambda r: r.start):
            if run.position < highest:
                violations.append(f"{key}: position {run.position} started after {highest}")
            highest = max(highest, run.position)
    return violations


def _overlaps(runs: list[Run], published: Published, faults: Faults) -> tuple[list[str], int]:
    """Pairs of runs of one key on two worker processes at the same time. A run its worker
    was paused in the middle of, or one that outlived its visibility by design, explains
    its overlaps; the rest are failures."""
    unexplained: list[str] = []
    explained = 0
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    for key, rs in by_key.items():
        if len({r.pid for r in rs}) < 2:
            continue
        rs.sort(key=lambda r: r.start)
        for i, a in enumerate(rs):
            a_end = faults.live_end(a)
            for b in rs[i + 1:]:
                if b.start >= a_end:
                    continue
                if b.pid == a.pid:
                    continue
                if any(faults.paused_within(r.pid, r.start, faults.live_end(r))
                       or _timed_out(r, published) for r in (a, b)):
                    explained += 1
                else:
                    unexplained.append(f"{key}: n={a.n} pid {a.pid} [{a.start:.2f}, {a_end:.2f}] "
                                       f"and n={b.n} pid {b.pid} from {b.start:.2f}")
    return unexplained, explained


def stored_twice(published: Published, runs: list[Run]) -> tuple[int, list[str]]:
    """Messages stored more than once. A re-publish after GC collected the original is
    a new message, as documented (the idempotency window ends at GC); any other second
    copy is a failure. Returns (re-published after GC, failures)."""
    failures = []
    after_gc = {again for n, first, again, existed in published.republished if existed is None}
    for n, _, again, existed in published.republished:
        if existed is not None and again != existed:
            failures.append(f"m{n}: re-published while offset {existed} was in the log, "
                            f"stored again at {again}")
    seen: dict[int, set[int]] = defaultdict(set)
    for run in runs:
        seen[run.n].add(run.offset)
    for n, offsets in seen.items():
        extra = offsets - {published.offsets.get(n, min(offsets))} - after_gc
        if extra:
            failures.append(f"m{n}: stored at offsets {sorted(offsets)}")
    return len(after_gc), failures


def table(reports: list[GroupReport]) -> str:
    rows: list[tuple[str, ...]] = [(
        "group", "published", "handled", "lost", "rolled back but handled", "duplicates",
        "unexplained dup.", "order violations", "in DLQ", "poison", "two workers at once",
        "final lag",
    )]
    for r in reports:
        rows.append((
            r.group, str(r.published), str(r.handled), str(len(r.lost)),
            str(len(r.rolled_back_handled)), str(r.duplicates),
            str(len(r.duplicates_unexplained)),
            str(len(r.order_violations)) if r.group == STRICT_GROUP else "n/a",
            str(r.dead_letters), str(r.poison),
            f"{len(r.overlaps)} ({r.overlaps_explained} explained)", str(r.lag),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def explanations(reports: list[GroupReport]) -> str:
    parts = []
    for r in reports:
        if r.duplicates_explained:
            reasons = ", ".join(f"{why}: {count}" for why, count
                                in sorted(r.duplicates_explained.items()))
            parts.append(f"{r.group} duplicates by cause: {reasons}")
    return "\n".join(parts)


def as_dict(report: GroupReport) -> dict[str, Any]:
    return {
        "group": report.group, "published": report.published, "handled": report.handled,
        "lost": len(report.lost), "rolled_back_handled": len(report.rolled_back_handled),
        "duplicates": report.duplicates,
        "duplicates_explained": dict(report.duplicates_explained),
        "duplicates_unexplained": len(report.duplicates_unexplained),
        "order_violations": len(report.order_violations), "dead_letters": report.dead_letters,
        "poison": report.poison, "overlaps": len(report.overlaps),
        "overlaps_explained": report.overlaps_explained, "lag": report.lag,
    }
