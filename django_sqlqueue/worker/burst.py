"""Burst mode: work until nothing is left to do, then exit at once.

Nothing is left when no held partition has a message due, in flight, or read and not
looked at, no handler runs, and no retry waits out its backoff: a message that failed and
will be retried within RETRY_WAIT is still work of this run, even while it waits parked in
the database (see :mod:`.parking`). A message published with a delay (or a task's
``run_after``) is not: the run ends without waiting for it, and its last line says how
many such messages remain.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..models import waiting
from . import attention
from .partitions import Partition, by_subscription

# Seconds ahead a burst worker waits for a retry: the default backoff's cap. A retry
# further out (a Retry(delay=...) asking for hours) is left to a later run.
RETRY_WAIT = 300.0
REMAINING_CAP = 10_000  # delayed messages counted at most for the last line


class Burst:
    """Decides when a burst worker is done (see the module's docstring)."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._retry_due = 0  # epoch ms: a parked retry comes due then; done is not asked before

    def done(self, partitions: Iterable[Partition], now_ms: int) -> bool:
        partitions = list(partitions)
        if not attention.nothing_left(partitions, now_ms) or now_ms < self._retry_due:
            return False
        due = self._next_parked_retry(partitions, now_ms + int(RETRY_WAIT * 1000))
        if due is not None:
            # Its partition reads it back when it comes due (see Partition.parked_due).
            self._retry_due = due
            return False
        return True

    def remaining(self, partitions: Iterable[Partition]) -> int:
        """Messages of ``partitions`` that wait for a later time (delayed, or a retry
        beyond RETRY_WAIT), counted up to REMAINING_CAP."""
        partitions = list(partitions)
        count = sum(1 for p in partitions for e in p.entries.values() if e.state != "in_flight")
        for (group, topic), held in by_subscription(partitions).items():
            if count >= REMAINING_CAP:
                break
            count += waiting.count_parked(group, topic, [p.number for p in held],
                                          REMAINING_CAP - count, self.using)
        return min(count, REMAINING_CAP)

    def _next_parked_retry(self, partitions: list[Partition], before_ms: int) -> int | None:
        earliest: int | None = None
        for (group, topic), held in by_subscription(partitions).items():
            due = waiting.next_retry(group, topic, [p.number for p in held], before_ms,
                                     self.using)
            if due is not None:
                earliest = due if earliest is None else min(earliest, due)
        return earliest
