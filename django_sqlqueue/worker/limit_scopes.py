"""What one poll cycle needs and locks of a limit's scope, and the messages it weighs
against them (see :mod:`.limits`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..consuming.limits import Claim, Rate
from ..consuming.message import Message
from ..models.limit_buckets import Bucket
from .partitions import Partition
from .window import Entry

# A message held for a slot held elsewhere is tried again this soon (ms); at once when
# this worker frees a slot of its scope.
HELD_RETRY_MS = 200
# ... and this soon when another worker's cycle held the scope's bucket (ms).
BUSY_RETRY_MS = 50


@dataclass
class Candidate:
    """A message the cycle is about to hand out."""

    partition: Partition
    entry: Entry
    message: Message


@dataclass
class Need:
    count: int = 0  # messages of the cycle claiming the scope
    max_running: int = 0  # the highest max_running among their claims (0: none)
    rate: Rate | None = None


@dataclass
class LockedScope:
    """What one cycle locked of a scope."""

    free: list[tuple[int, int]] = field(default_factory=list)  # (row id, slot), lowest first
    bucket: Bucket | None = None
    bucket_busy: bool = False  # another worker's cycle holds the bucket
    taken_tokens: int = 0

    def can(self, claim: Claim) -> bool:
        limit = claim.max_running
        if limit is not None and not any(slot < limit for _, slot in self.free):
            return False
        return claim.rate is None or (self.bucket is not None and self.bucket.tokens >= 1)

    def take(self, claim: Claim) -> int | None:
        """Spend the claim (can() said yes); the slot row taken, if any."""
        row_id = None
        if claim.max_running is not None:
            index = next(i for i, (_, slot) in enumerate(self.free) if slot < claim.max_running)
            row_id = self.free.pop(index)[0]
        if claim.rate is not None and self.bucket is not None:
            self.bucket.tokens -= 1
            self.taken_tokens += 1
        return row_id

    def retry_at(self, claim: Claim, now_ms: int, held_retry_ms: int = HELD_RETRY_MS) -> int:
        """When a message denied by this scope should be tried again."""
        due = now_ms
        if claim.rate is not None and (self.bucket is None or self.bucket.tokens < 1):
            if self.bucket is None:
                due = now_ms + BUSY_RETRY_MS
            else:
                due = now_ms + max(1, math.ceil((1 - self.bucket.tokens) / claim.rate.per_ms))
        if claim.max_running is not None and not any(s < claim.max_running for _, s in self.free):
            due = max(due, now_ms + held_retry_ms)
        return due
