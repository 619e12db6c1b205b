"""The fleet-wide limits as an operator sees them: for each scope, how many of its slots run
and how full its bucket is, from the few rows the limits keep (one per slot of a scope's
own limit, a few per key running lately, one bucket per rate). Nothing here needs the
subscriptions' code: a web process sees the limits its workers use."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

from ..conf import queue_database
from ..consuming.limits import parse_rate
from ..models import LimitBucket, LimitSlot
from .names import database_now_ms


@dataclass(frozen=True)
class LimitStats:
    """One limit scope: a subscription ("group:topic"), a task ("task:path") or the tasks'
    concurrency keys ("tasks")."""

    scope: str
    max_running: int | None  # the slots the workers made for it
    running: int  # its own slots held now
    rate: str | None  # as declared
    tokens: float | None  # in its own bucket at its last write (refill since included when known)
    keys_running: int  # keys holding per-key slots now
    key_slots_running: int  # ... and the slots they hold
    keyed_buckets: int  # keys with a bucket not yet full again (started lately)
    max_running_per_key: int | None = None
    rate_per_key: str | None = None

    @property
    def fullness(self) -> float | None:
        """Share of the scope's own slots running (0 to 1); None without a max_running."""
        if not self.max_running:
            return None
        return min(1.0, self.running / self.max_running)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "fullness": self.fullness}


def limits_overview(using: str | None = None) -> list[LimitStats]:
    """One row per limit scope the workers have used, from the limits' own rows: the
    slots a scope has are its max_running, and its buckets record their rate."""
    using = using or queue_database()
    now_ms = database_now_ms(using)
    slots = {row["scope"]: row for row in LimitSlot.objects.usage(now_ms, using)}
    buckets = {row["scope"]: row for row in LimitBucket.objects.usage(now_ms, using)}
    result = []
    for scope in sorted(set(slots) | set(buckets)):
        slot = slots.get(scope, {})
        bucket = buckets.get(scope, {})
        tokens, rate = bucket.get("tokens"), bucket.get("rate")
        if tokens is not None and rate:
            with contextlib.suppress(ValueError):  # refilled since its last write
                per = parse_rate(rate)
                ago = max(0, int(bucket.get("written_ms_ago") or 0))
                tokens = min(float(per.count), float(tokens) + ago * per.per_ms)
        per_key = slot.get("per_key")
        result.append(LimitStats(
            scope=scope, max_running=int(slot.get("slots") or 0) or None,
            running=int(slot.get("running") or 0), rate=rate,
            tokens=None if tokens is None else round(float(tokens), 1),
            keys_running=int(slot.get("keys_running") or 0),
            key_slots_running=int(slot.get("key_slots_running") or 0),
            keyed_buckets=int(bucket.get("keys") or 0),
            max_running_per_key=None if per_key is None else int(per_key) + 1,
            rate_per_key=bucket.get("rate_per_key")))
    return result
