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

A partition's cycle that fails alone for a reason tied to its messages (it handed out,
recorded or extended some, and no lock wait failed it) is narrowed down the same way,
over those messages: each half runs in a cycle of its own that touches no other message
of the partition (the others wait, due, in its window), and a half that fails again is
split again. A message whose cycle fails with nothing else in it RELEASE_AFTER times, after
the growing pauses, is dead-lettered by the next cycle with the error as its reason, and
the partition runs as before. So a message that fails every cycle it is in costs about
log2(messages in the cycle) + RELEASE_AFTER + 1 cycles, not the partition for ever. If
that last cycle fails too, the failure was not the message's: the partition is released,
as a partition that keeps failing alone is.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from ..logtext import loggable
from .partitions import Ident, Partition

logger = logging.getLogger("django_sqlqueue.worker")

RELEASE_AFTER = 3  # failures of a partition alone (not contention) before it is released
FIRST_PAUSE = 0.1  # seconds before a partition that failed alone is tried again ...
LONGEST_PAUSE = 5.0  # ... doubling up to this


@dataclass
class Suspects:
    """Partitions whose cycle failed, run apart from the others until they succeed; or
    some messages of one partition, whose cycle runs without its other messages."""

    members: frozenset[Ident]
    failures: int = 0  # failures of these partitions (or messages) alone
    retry_at: float = 0.0  # time.monotonic()
    messages: frozenset[int] | None = None  # offsets; None: the whole partitions
    error: str = ""  # why its last cycle failed
    doom: bool = False  # ``messages`` is the one message found: dead-letter it


@dataclass(frozen=True)
class Narrowing:
    """A cycle restricted to some messages of one partition: only they are handed out,
    extended or have their outcomes recorded; with ``doom`` set they are dead-lettered
    with it as the reason."""

    ident: Ident
    offsets: frozenset[int]
    doom: str | None = None


@dataclass
class Batch:
    """Partitions that run in one cycle; ``suspects`` None for the ones above suspicion."""

    partitions: dict[Ident, Partition]
    suspects: Suspects | None = None

    @property
    def narrowing(self) -> Narrowing | None:
        suspects = self.suspects
        if suspects is None or suspects.messages is None:
            return None
        [ident] = suspects.members
        doom = None
        if suspects.doom:
            doom = (f"its poll cycle failed {suspects.failures} times with only this message "
                    f"in it: {suspects.error}")
        return Narrowing(ident, suspects.messages, doom)


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
                  now: float, touched: Collection[int] = ()) -> Partition | None:
        """``batch``'s cycle failed with ``exc``, after touching the messages ``touched``
        (offsets, when it ran one partition): log it, and try its partitions (or those
        messages) apart from the others from now on. Returns its partition when, alone,
        it failed often enough to be released."""
        names = ",".join(sorted(f"{g}:{t}/{n}" for g, t, n in batch.partitions)[:10])
        error = loggable(" ".join(f"{type(exc).__name__}: {exc}".split()), 300)
        narrowing = batch.narrowing
        if narrowing is not None:
            group, topic, number = narrowing.ident
            logger.warning("poll cycle narrowed to some messages of a partition failed "
                           "group=%s topic=%s partition=%s messages=%s first_offset=%s "
                           "dead_lettering=%s error=%s", group, topic, number,
                           len(narrowing.offsets), min(narrowing.offsets),
                           narrowing.doom is not None, error)
        elif contention:
            logger.warning("poll cycle failed, trying its partitions apart from the others "
                           "partitions=%s error=%s", names, error)
        else:
            logger.error("poll cycle failed, trying its partitions apart from the others "
                         "partitions=%s error=%s", names, error, exc_info=exc)
        if not self.failed(batch, contention, now, touched, error):
            return None
        [partition] = batch.partitions.values()
        if narrowing is not None and narrowing.doom is not None:
            logger.error("could not dead-letter the message that fails its partition's poll "
                         "cycle; the failure is not the message's group=%s topic=%s "
                         "partition=%s offset=%s", partition.group, partition.topic,
                         partition.number, min(narrowing.offsets))
        logger.error("releasing a partition whose poll cycle keeps failing; its window "
                     "will be read afresh group=%s topic=%s partition=%s failures=%s",
                     partition.group, partition.topic, partition.number, RELEASE_AFTER)
        return partition

    def failed(self, batch: Batch, contention: bool, now: float,
               touched: Collection[int] = (), error: str = "") -> bool:
        """Note that ``batch``'s cycle failed, after touching the messages ``touched``;
        return True when its partition, alone, failed often enough to be released."""
        suspects = batch.suspects
        if suspects is not None:
            self.groups.remove(suspects)
        idents = sorted(batch.partitions)
        if len(idents) > 1:
            half = len(idents) // 2
            self.groups += [Suspects(frozenset(idents[:half])), Suspects(frozenset(idents[half:]))]
            return False
        members = frozenset(idents)
        if suspects is not None and suspects.messages is not None:
            return self._narrowed_failed(suspects, contention, now, touched, error)
        if touched and not contention:
            self._split(members, frozenset(touched), now, error)
            return False
        failures = 1 if suspects is None else suspects.failures + 1
        if not contention and failures >= RELEASE_AFTER:
            return True
        self.groups.append(Suspects(members, failures, now + _pause(failures)))
        return False

    def _narrowed_failed(self, suspects: Suspects, contention: bool, now: float,
                         touched: Collection[int], error: str) -> bool:
        """A cycle narrowed to ``suspects.messages`` failed; return True to release the
        partition."""
        messages = suspects.messages or frozenset()
        members = suspects.members
        if contention:  # a lock wait says nothing about the messages: the same again
            self.groups.append(Suspects(members, suspects.failures,
                                        now + _pause(suspects.failures + 1), messages,
                                        suspects.error, suspects.doom))
            return False
        if suspects.doom:
            self._forget(members)
            return True  # dead-lettering it failed too: the fault is the partition's
        failures = suspects.failures + 1
        inside = frozenset(touched) & messages
        if len(inside) > 1 or inside and len(messages) > 1:
            self._split(members, inside, now, error)
        elif inside:  # one message alone, again: dead-lettered once it failed often enough
            self.groups.append(Suspects(members, failures, now + _pause(failures), messages,
                                        error, doom=failures >= RELEASE_AFTER))
        elif failures >= RELEASE_AFTER:
            # Failing before it touched any of them: the partition's fault, as far as can
            # be told, and released as a partition failing alone is.
            self._forget(members)
            return True
        else:
            self.groups.append(Suspects(members, failures, now + _pause(failures), messages,
                                        error))
        return False

    def _split(self, members: frozenset[Ident], messages: frozenset[int], now: float,
               error: str) -> None:
        """Run ``messages`` of the partition ``members`` in two cycles of their own (or
        one, for one message, after a pause)."""
        offsets = sorted(messages)
        if len(offsets) == 1:  # it has not failed alone yet
            self.groups.append(Suspects(members, 0, now + _pause(1), messages, error))
            return
        half = len(offsets) // 2
        self.groups += [Suspects(members, 0, 0.0, frozenset(offsets[:half]), error),
                        Suspects(members, 0, 0.0, frozenset(offsets[half:]), error)]

    def _forget(self, members: frozenset[Ident]) -> None:
        """Drop every narrowing of a partition about to be released."""
        self.groups = [g for g in self.groups if not g.members & members]

    def suspected(self) -> int:
        """Partitions run apart from the others."""
        return len(set().union(*(g.members for g in self.groups)))


def _pause(failures: int) -> float:
    """Seconds before a partition (or message) that failed alone ``failures`` times is
    tried again."""
    return float(min(LONGEST_PAUSE, FIRST_PAUSE * 2 ** (failures - 1)))
