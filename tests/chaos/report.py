"""What a chaos run did to each consumer group: lost, duplicated, reordered, overlapped.

Judged per stored row against what the publishers recorded (``evidence.py``), never against
the queue's own idea of it: a row is lost unless its group ran it successfully or holds
exactly one dead-letter copy of it, and a key's order is the order its publishers committed
in. Every count that must be 0 is checked by :meth:`GroupReport.failures`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .evidence import Faults, Published, Run, Stored, read_faults, read_published, read_runs

__all__ = ["GROUPS", "GroupReport", "analyse", "as_dict", "explanations", "read_faults",
           "read_published", "read_runs", "stored_twice", "table"]

GROUPS = ("ledger", "strict", "audit")
STRICT_GROUP = "strict"
TIMEOUT_GROUP = "audit"  # no auto-extension: a slow first run outlives its visibility
# Seconds after a redelivery within which the worker that lost the message's partition
# notices and logs it (it renews every second; a slow cycle delays that).
LEASE_LOSS_SLACK = 5.0


@dataclass
class GroupReport:
    group: str
    published: int = 0  # stored rows
    handled: int = 0
    lost: list[str] = field(default_factory=list)
    rolled_back_handled: list[int] = field(default_factory=list)
    duplicates: int = 0
    duplicates_explained: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    duplicates_unexplained: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    dead_letters: int = 0  # copies, counted
    poison: int = 0  # stored poison rows
    dead_letters_unexplained: list[str] = field(default_factory=list)
    dead_letters_twice: list[str] = field(default_factory=list)
    poison_missing: list[str] = field(default_factory=list)
    overlaps_explained: int = 0
    overlaps: list[str] = field(default_factory=list)
    owned_twice_explained: int = 0
    owned_twice: list[str] = field(default_factory=list)
    lag: int = -1

    def failures(self) -> list[str]:
        found = []
        for label, items in (
            ("lost", self.lost),
            ("handled although rolled back", self.rolled_back_handled),
            ("duplicates no fault on their worker explains", self.duplicates_unexplained),
            ("order violations", self.order_violations),
            ("dead letters that are not poison", self.dead_letters_unexplained),
            ("messages dead-lettered more than once", self.dead_letters_twice),
            ("poison messages missing from the dead-letter topic", self.poison_missing),
            ("runs of one key at once that strict mode or a live lease forbids", self.overlaps),
            ("runs of one partition on two workers at once (a partition owned twice)",
             self.owned_twice),
        ):
            if items:
                found.append(f"{self.group}: {len(items)} {label}, e.g. {items[:5]}")
        if self.lag != 0:
            found.append(f"{self.group}: final lag {self.lag}, expected 0")
        return found


def analyse(group: str, published: Published, runs: list[Run], faults: Faults,
            dead_letters: Counter[int], lag: int) -> GroupReport:
    """``dead_letters``: this group's dead-letter copies, counted per original offset."""
    report = GroupReport(group, published=len(published.rows), lag=lag)
    mine = [r for r in runs if r.group == group]
    by_offset: dict[int, list[Run]] = defaultdict(list)
    for run in sorted(mine, key=lambda r: r.start):
        by_offset[run.offset].append(run)
    succeeded = {run.offset for run in mine if run.ok}
    for offset, row in sorted(published.rows.items()):
        if offset in succeeded or dead_letters[offset]:
            report.handled += 1
        else:
            report.lost.append(f"m{row.n}@{offset}")
    report.rolled_back_handled = sorted(published.rolled_back & {run.n for run in mine})
    for rs in by_offset.values():
        _duplicates(report, [r for r in rs if r.ok], published, faults)
    _dead_letters(report, published, dead_letters)
    report.order_violations = _order_violations(group, published, by_offset, dead_letters)
    report.overlaps, report.overlaps_explained = _overlaps(group, mine, published, faults)
    report.owned_twice, report.owned_twice_explained = _owned_twice(mine, published, faults)
    return report


# --------------------------------------------------------------------------- duplicates


def _duplicates(report: GroupReport, successes: list[Run], published: Published,
                faults: Faults) -> None:
    """Each successful run after the first must be explained by every earlier successful
    run of that row: something kept that run's ack from taking effect."""
    for i, later in enumerate(successes[1:], start=1):
        report.duplicates += 1
        reasons = [_why_again(earlier, later, published, faults) for earlier in successes[:i]]
        if all(reasons):
            report.duplicates_explained[reasons[-1]] += 1
        else:
            earlier = successes[reasons.index("")]
            report.duplicates_unexplained.append(
                f"m{later.n}@{later.offset} attempt {earlier.attempt} ran ok on pid "
                f"{earlier.pid} thread {earlier.thread} [{earlier.start:.3f}, "
                f"{earlier.end:.3f}], attempt {later.attempt} again on pid {later.pid} "
                f"thread {later.thread} from {later.start:.3f}")


def _timed_out(run: Run, published: Published) -> bool:
    """The run outlived its message's visibility by design (a hang, or a slow run in the
    group that does not extend visibility)."""
    flag = published.flags.get(run.n)
    if run.attempt != 1:
        return False
    return flag == "hang" or (flag == "slow" and run.group == TIMEOUT_GROUP)


def _why_again(earlier: Run, later: Run, published: Published, faults: Faults) -> str:
    """Why ``later`` ran although ``earlier`` (a successful run of the same row, started
    before it) should have been acked; '' if nothing explains it. Only a fault that hit
    ``earlier``'s worker while it held the message counts: from the run's start until its
    ack committed or the message was redelivered. A lost lease counts even after the ack
    (a fenced ack is announced too), when the worker logged it around the redelivery."""
    if _timed_out(earlier, published):
        return "timeout"
    acked = faults.acked_after(earlier)
    until = later.start if acked is None else min(later.start, acked)
    if faults.killed_within(earlier.pid, earlier.start, until):
        return "worker killed before the ack"
    if faults.paused_within(earlier.pid, earlier.start, until):
        return "worker paused past its lease"
    if faults.lease_lost_within(earlier.pid, earlier.group, earlier.partition, earlier.start,
                                later.start + LEASE_LOSS_SLACK):
        return "worker lost the partition's lease"
    if faults.outage_within(earlier.start, until):
        return "database restart"
    return ""


# --------------------------------------------------------------------------- dead letters


def _dead_letters(report: GroupReport, published: Published, copies: Counter[int]) -> None:
    report.dead_letters = sum(copies.values())
    for offset, count in sorted(copies.items()):
        row = published.rows.get(offset)
        name = f"m{row.n}@{offset}" if row else f"offset {offset} (no publisher stored it)"
        if count > 1:
            report.dead_letters_twice.append(f"{name} x{count}")
        if row is None or row.flag != "poison":
            report.dead_letters_unexplained.append(name)
    poison = [row for row in published.rows.values() if row.flag == "poison"]
    report.poison = len(poison)
    report.poison_missing = [f"m{row.n}@{row.offset}" for row in poison if not copies[row.offset]]


# --------------------------------------------------------------------------- order


def publish_order(published: Published) -> dict[str, list[tuple[Stored, Stored]]]:
    """Per key, the pairs (a, b) whose order the queue promises: a before b when both are
    in one transaction and a was published first, or when a's transaction had committed
    before b's began to commit and a has the lower offset (docs/data-model.md, "The order
    consumers see")."""
    by_key: dict[str, list[Stored]] = defaultdict(list)
    for row in published.rows.values():
        by_key[row.key].append(row)
    txs = published.transactions
    pairs: dict[str, list[tuple[Stored, Stored]]] = {}
    for key, rows in by_key.items():
        if len(rows) < 2:
            continue
        rows.sort(key=lambda r: (txs[r.tx].end, r.index))
        found = []
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                if a.tx == b.tx:
                    if a.index != b.index:
                        found.append((a, b) if a.index < b.index else (b, a))
                elif txs[a.tx].end < txs[b.tx].begin and a.offset < b.offset:
                    found.append((a, b))
        if found:
            pairs[key] = found
    return pairs


def _order_violations(group: str, published: Published, by_offset: dict[int, list[Run]],
                      dead_letters: Counter[int]) -> list[str]:
    """In every group, a key's positions must follow its publish order (the sequencer's
    promise). In the strict group, the earlier message must also be finished (acked or
    dead-lettered) before any run of the later one starts."""
    violations = []
    for key, pairs in publish_order(published).items():
        for a, b in pairs:
            runs_a, runs_b = by_offset.get(a.offset), by_offset.get(b.offset)
            if not runs_a or not runs_b:
                continue  # never delivered: counted as lost
            what = (f"{key}: m{a.n}@{a.offset} published before m{b.n}@{b.offset}")
            if runs_a[0].position >= runs_b[0].position:
                violations.append(f"{what}, but positioned at {runs_a[0].position} and "
                                  f"{runs_b[0].position}")
                continue
            if group != STRICT_GROUP:
                continue
            done = _finished(runs_a, dead_letters[a.offset] > 0)
            started = runs_b[0].start
            if done is None or started < done:
                violations.append(f"{what}, but m{b.n} started at {started:.2f} before m{a.n} "
                                  f"was finished ({'never' if done is None else f'{done:.2f}'})")
    return violations


def _finished(runs: list[Run], dead_lettered: bool) -> float | None:
    """When a message was done with: its first successful run's end, or, dead-lettered,
    the end of its last failed run."""
    ends = [r.end for r in runs if r.ok and r.end is not None]
    if ends:
        return min(ends)
    if dead_lettered:
        failed = [r.end for r in runs if r.end is not None]
        return max(failed) if failed else None
    return None


# --------------------------------------------------------------------------- overlaps


def _overlaps(group: str, runs: list[Run], published: Published,
              faults: Faults) -> tuple[list[str], int]:
    """Runs of one key at the same time: on two worker processes in every group (a worker
    that lost a partition starts nothing more of it), and in the strict group on two threads
    of one process too. A run its worker was paused in the middle of (it cannot be recalled),
    or one that outlived its visibility by design, explains an overlap of two processes; only
    the latter explains one within a process."""
    unexplained: list[str] = []
    explained = 0
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    for key, rs in by_key.items():
        if len(rs) < 2:
            continue
        rs.sort(key=lambda r: r.start)
        for i, a in enumerate(rs):
            a_end = faults.live_end(a)
            for b in rs[i + 1:]:
                if b.start >= a_end:
                    continue
                same = b.pid == a.pid
                if same and group != STRICT_GROUP:
                    continue  # concurrent mode runs a key's messages side by side
                timed_out = any(_timed_out(r, published) for r in (a, b))
                paused = not same and any(
                    faults.paused_within(r.pid, r.start, faults.live_end(r)) for r in (a, b))
                if timed_out or paused:
                    explained += 1
                else:
                    where = f"pid {a.pid}" + (" (two threads)" if same else f" and pid {b.pid}")
                    unexplained.append(f"{key}: m{a.n}@{a.offset} [{a.start:.2f}, {a_end:.2f}] "
                                       f"and m{b.n}@{b.offset} from {b.start:.2f} on {where}")
    return unexplained, explained


def _owned_twice(runs: list[Run], published: Published,
                 faults: Faults) -> tuple[list[str], int]:
    """Runs of one partition on two worker processes at the same time: only one worker owns
    a partition, and one that lost it starts nothing more of it. Explained as for keys: a
    run its worker was paused in the middle of, or one that outlived its visibility by
    design (the hung run, whose partition is handed on once it passes MAX_HANDLER_TIME)."""
    unexplained: list[str] = []
    explained = 0
    by_partition: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_partition[run.partition].append(run)
    for partition, rs in by_partition.items():
        rs.sort(key=lambda r: r.start)
        live: list[tuple[float, Run]] = []  # runs not yet ended, with their end
        for b in rs:
            live = [(end, a) for end, a in live if end > b.start]
            for _, a in live:
                if a.pid == b.pid:
                    continue
                if any(_timed_out(r, published) or
                       faults.paused_within(r.pid, r.start, faults.live_end(r)) for r in (a, b)):
                    explained += 1
                else:
                    unexplained.append(f"partition {partition}: m{a.n}@{a.offset} on pid {a.pid} "
                                       f"from {a.start:.2f}, m{b.n}@{b.offset} on pid {b.pid} "
                                       f"from {b.start:.2f}")
            live.append((faults.live_end(b), b))
    return unexplained, explained


# --------------------------------------------------------------------------- stored twice


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


# --------------------------------------------------------------------------- printing


def table(reports: list[GroupReport]) -> str:
    rows: list[tuple[str, ...]] = [(
        "group", "stored", "handled", "lost", "rolled back but handled", "duplicates",
        "unexplained dup.", "order violations", "in DLQ", "poison", "DLQ twice",
        "one key at once", "partition on two workers", "final lag",
    )]
    for r in reports:
        rows.append((
            r.group, str(r.published), str(r.handled), str(len(r.lost)),
            str(len(r.rolled_back_handled)), str(r.duplicates),
            str(len(r.duplicates_unexplained)), str(len(r.order_violations)),
            str(r.dead_letters), str(r.poison), str(len(r.dead_letters_twice)),
            f"{len(r.overlaps)} ({r.overlaps_explained} explained)",
            f"{len(r.owned_twice)} ({r.owned_twice_explained} explained)", str(r.lag),
        ))
    return markdown(rows)


def markdown(rows: list[tuple[str, ...]]) -> str:
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
        "group": report.group, "stored": report.published, "handled": report.handled,
        "lost": len(report.lost), "rolled_back_handled": len(report.rolled_back_handled),
        "duplicates": report.duplicates,
        "duplicates_explained": dict(report.duplicates_explained),
        "duplicates_unexplained": len(report.duplicates_unexplained),
        "order_violations": len(report.order_violations), "dead_letters": report.dead_letters,
        "dead_letters_twice": len(report.dead_letters_twice),
        "poison": report.poison, "overlaps": len(report.overlaps),
        "overlaps_explained": report.overlaps_explained,
        "owned_twice": len(report.owned_twice),
        "owned_twice_explained": report.owned_twice_explained, "lag": report.lag,
    }
