"""The fleet-wide limits as ``drain()`` applies them, on its own clock.

``rate`` (and ``rate_per_key``, and a task's ``rate``) is applied as a worker applies it:
each start takes a token of the scope's bucket, the same ``queue_limit_buckets`` row the
workers use, refilled by the drain's clock; a message whose bucket is empty is held back,
not handed out, until its next token is due (then ``advance_delays`` moves the clock
there, or the drain stops and says when it is due). ``max_running`` needs nothing here:
a drain runs one handler at a time, so at most one runs at once, whatever the limit.
Slot rows are not taken: a drain is not meant to run beside workers of the same database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..consuming.limits import Rate
from ..consuming.registry import Subscription
from ..models import LimitBucket
from ..models.limit_buckets import Bucket
from ..worker.limits import Candidate, LimitGate

# Milliseconds a message waits when a worker's transaction holds its bucket right now.
BUSY_RETRY_MS = 100


class DrainLimits(LimitGate):
    """A worker's limit gate that applies the rates only (see the module's docstring)."""

    def __init__(self, using: str) -> None:
        super().__init__("", 0, using)

    def hand_out_cap(self, subscription: Subscription, now_ms: int) -> tuple[int | None, int]:
        return None, 0  # what is over a rate is held back one by one in admit()

    def release(self, now_ms: int) -> None:
        return None  # no slots are taken, none held back waits for one

    def admit(self, candidates: Sequence[Candidate], now_ms: int) -> list[Candidate]:
        """Take a token of each of a message's rated scopes, in hand-out order; hold back
        (until its next token) each message that cannot have them all."""
        buckets: dict[tuple[str, str], tuple[Bucket | None, Rate]] = {}
        held: list[Candidate] = []
        for candidate in candidates:
            limits = candidate.partition.subscription.limits
            claims = [] if limits is None else [c for c in limits.claims(candidate.message)
                                                if c.rate is not None]
            due = now_ms
            for claim in claims:
                assert claim.rate is not None  # noqa: S101 - filtered above
                scope = (claim.scope, claim.key)
                if scope not in buckets:
                    buckets[scope] = (LimitBucket.objects.lock(
                        claim.scope, claim.key, str(claim.rate), claim.rate.count,
                        claim.rate.per_ms, now_ms, self.using), claim.rate)
                bucket = buckets[scope][0]
                if bucket is None:
                    due = max(due, now_ms + BUSY_RETRY_MS)
                elif bucket.tokens < 1:
                    due = max(due, now_ms + max(1, math.ceil((1 - bucket.tokens)
                                                             / claim.rate.per_ms)))
            if due > now_ms:
                candidate.partition.hold_until(candidate.entry, due)
                held.append(candidate)
                continue
            for claim in claims:
                bucket = buckets[(claim.scope, claim.key)][0]
                if bucket is not None:
                    bucket.tokens -= 1
        for bucket, rate in buckets.values():
            if bucket is not None:
                LimitBucket.objects.save_tokens(bucket, rate.count, rate.per_ms, now_ms,
                                                self.using)
        return held
