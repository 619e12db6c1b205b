"""Keeping a poll cycle that fails for one partition from stopping the others.

A poll cycle is one transaction over every partition the worker holds, so a statement
that fails for one partition (a row another transaction holds past the lock timeout, a
value the database refuses) fails them all, and would again at every poll. So after a
failed cycle the partitions that were in it are split in two, and each half runs in a
cycle of its own; a half that fails again is split again. Within a few polls the failing
partition runs alone, after a growing pause, while the rest run together as before (and
once a cycle of a poll failed waiting for a lock, the poll runs no further suspects, so it
waits for at most one lock and the lease renewals keep their pace). A
partition that keeps failing alone for another reason than contention is released
(RELEASE_AFTER failures): another worker reads its window afresh, or this one does after
a lease.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..logtext import loggable
from .partitions import Ident, Partition

logger = logging.getLogger("django_sqlqueue.worker")

RELEASE_AFTER = 3  # failures of a partition alone (not contention) before it is released
FIRST_PAUSE = 0.1  # seconds before a partition that failed alone is tried again ...
LONGEST_PAUSE = 5.0  # ... doubling up to this


@dataclass
class Suspects:
    """Partitions whose cycle failed, run apart from the others until they succeed."""

    members: frozenset[Ident]
    failures: int = 0  # failures of these partitions alone (one partition only)
    retry_at: float = 0.0  # time.monotonic()


@dataclass
class Batch:
    """Partitions that run in one cycle; ``suspects`` None for the ones above suspicion."""

    partitions: dict[Ident, Partition]
    suspects: Suspects | None = None


@dataclass
class Isolation:
    groups: list[Suspects] = field(default_factory=list)

    def batches(self, held: dict[Ident, Partition], now: float) -> list[Batch]:
        """This poll's cycles: the partitions above suspicion together (maybe none), then
        each group of suspects whose pause is over."""
        self.groups = [g for g in self.groups if g.members & held.keys()]
        suspected = set().union(*(g.members for g in self.groups))
        clean = {ident: p for ident, p in held.items() if ident not in suspected}
        # Run even when empty: outcomes of partitions no longer held are settled in it.
        batches = [Batch(clean)]
        for group in self.groups:
            if group.retry_at <= now:
                members = {ident: held[ident] for ident in sorted(group.members) if ident in held}
                batches.append(Batch(members, group))
        return batches

    def succeeded(self, batch: Batch) -> None:
        if batch.suspects is not None:
            self.groups.remove(batch.suspects)

    def set_aside(self, batch: Batch, exc: Exception, contention: bool,
                  now: float) -> Partition | None:
        """``batch``'s cycle failed with ``exc``: log it, and try its partitions apart from
        the others from now on. Returns its partition when, alone, it failed often enough
        to be released."""
        names = ",".join(sorted(f"{g}:{t}/{n}" for g, t, n in batch.partitions)[:10])
        error = loggable(" ".join(f"{type(exc).__name__}: {exc}".split()), 300)
        if contention:
            logger.warning("poll cycle failed, trying its partitions apart from the others "
                           "partitions=%s error=%s", names, error)
        else:
            logger.error("poll cycle failed, trying its partitions apart from the others "
                         "partitions=%s error=%s", names, error, exc_info=exc)
        if not self.failed(batch, contention, now):
            return None
        [partition] = batch.partitions.values()
        logger.error("releasing a partition whose poll cycle keeps failing; its window "
                     "will be read afresh group=%s topic=%s partition=%s failures=%s",
                     partition.group, partition.topic, partition.number, RELEASE_AFTER)
        return partition

    def failed(self, batch: Batch, contention: bool, now: float) -> bool:
        """Note that ``batch``'s cycle failed; return True when its partition, alone,
        failed often enough to be released."""
        if batch.suspects is not None:
            self.groups.remove(batch.suspects)
        idents = sorted(batch.partitions)
        if len(idents) > 1:
            half = len(idents) // 2
            self.groups += [Suspects(frozenset(idents[:half])), Suspects(frozenset(idents[half:]))]
            return False
        failures = 1 if batch.suspects is None else batch.suspects.failures + 1
        if not contention and failures >= RELEASE_AFTER:
            return True
        pause = min(LONGEST_PAUSE, FIRST_PAUSE * 2 ** (failures - 1))
        self.groups.append(Suspects(frozenset(idents), failures, now + pause))
        return False

    def suspected(self) -> int:
        return sum(len(g.members) for g in self.groups)
