"""``queue_limit_buckets``: the token buckets of ``rate`` limits, one row per scope (and per
key running lately, for per-key rates).

A bucket holds up to one period's worth of tokens and refills continuously; starting a
message takes one. The row stores the rate as declared, the tokens left at
``refilled_at`` (epoch ms, database clock) and when it will be full again: a missing row
is a full bucket, so per-key rows whose bucket refilled are deleted. A worker locks the
row with ``FOR UPDATE SKIP LOCKED`` in its poll transaction and writes what it took:
while another worker's cycle holds it, this one hands nothing of the scope out and tries
again shortly, never waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections, models

from ..db import sql as sqlb
from .fields import KEY_LENGTH, SCOPE_LENGTH
from .limit_slots import DIGEST_LENGTH, key_digest


@dataclass
class Bucket:
    """A bucket locked for this transaction."""

    id: int
    tokens: float  # available now, refill included


RATE_LENGTH = 32


class LimitBucketManager(models.Manager["LimitBucket"]):
    """SQL for ``queue_limit_buckets``."""

    def lock(self, scope: str, key: str, rate: str, capacity: float, per_ms: float, now_ms: int,
             using: str) -> Bucket | None:
        """The bucket of (scope, key), created full if missing, locked for this transaction;
        None while another transaction holds it."""
        digest = key_digest(key)
        rows = self.using(using).filter(scope=scope, limit_key=digest)
        locked = rows.select_for_update(skip_locked=True).values_list("id", "tokens", "refilled_at")
        found = list(locked[:1])
        if not found:
            if rows.exists():
                return None  # another transaction holds it
            connection = connections[using]
            q = sqlb.quoter(connection)
            prefix, suffix = sqlb.insert_ignore(connection, ("scope", "limit_key"))
            columns = ", ".join(q(c) for c in ("scope", "limit_key", "key_label", "rate",
                                                "tokens", "refilled_at", "full_at"))
            sqlb.execute(connection,
                         f"{prefix} {q('queue_limit_buckets')} ({columns}) "  # noqa: S608 - names quoted, values bound
                         f"VALUES (%s, %s, %s, %s, %s, %s, %s){suffix}",
                         [scope, digest, key[:KEY_LENGTH], rate[:RATE_LENGTH], capacity, now_ms,
                          now_ms])
            found = list(locked[:1])
            if not found:
                return None
        row_id, tokens, refilled_at = found[0]
        elapsed = max(0, now_ms - int(refilled_at))
        return Bucket(int(row_id), min(float(capacity), float(tokens) + elapsed * per_ms))

    def save_tokens(self, bucket: Bucket, capacity: float, per_ms: float, now_ms: int,
                    using: str) -> None:
        """Write what is left of a locked bucket after this cycle took its tokens."""
        full_at = now_ms + int((capacity - bucket.tokens) / per_ms) + 1
        self.using(using).filter(id=bucket.id).update(tokens=bucket.tokens, refilled_at=now_ms,
                                                      full_at=full_at)

    def sweep(self, now_ms: int, using: str) -> int:
        """Delete per-key buckets that are full again (a missing row is a full bucket)."""
        return self.using(using).exclude(limit_key="").filter(full_at__lt=now_ms).delete()[0]

    def usage(self, now_ms: int, using: str) -> list[dict[str, Any]]:
        """Per scope: its own bucket's tokens at its last write and how long ago that was,
        and how many keys have a bucket of their own (keys started lately)."""
        own = {scope: (rate, float(tokens), int(refilled_at))
               for scope, rate, tokens, refilled_at in self.using(using).filter(limit_key="")
               .values_list("scope", "rate", "tokens", "refilled_at")}
        keyed = {scope: (rate, int(n)) for scope, rate, n in
                 self.using(using).exclude(limit_key="").values("scope")
                 .annotate(r=models.Max("rate"), n=models.Count("id")).values_list("scope", "r", "n")}
        result: list[dict[str, Any]] = []
        for scope in sorted(set(own) | set(keyed)):
            rate, tokens, refilled_at = own.get(scope, (None, None, None))
            key_rate, keys = keyed.get(scope, (None, 0))
            result.append({"scope": scope, "rate": rate or None, "tokens": tokens,
                           "written_ms_ago": None if refilled_at is None else now_ms - refilled_at,
                           "rate_per_key": key_rate or None, "keys": keys})
        return result


class LimitBucket(models.Model):
    """A token bucket of a ``rate`` limit (``queue_limit_buckets``)."""

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=SCOPE_LENGTH)
    limit_key = models.CharField(max_length=DIGEST_LENGTH, default="", blank=True)
    key_label = models.CharField(max_length=KEY_LENGTH, default="", blank=True)
    rate = models.CharField(max_length=RATE_LENGTH, default="", blank=True)  # as declared
    tokens = models.FloatField()
    refilled_at = models.BigIntegerField()
    full_at = models.BigIntegerField()

    objects = LimitBucketManager()

    class Meta:
        db_table = "queue_limit_buckets"
        constraints = [
            models.UniqueConstraint(fields=["scope", "limit_key"], name="queue_limit_bucket_unique"),
        ]
        indexes = [models.Index(fields=["full_at"], name="queue_limit_bucket_full")]

    def __str__(self) -> str:
        return f"{self.scope}[{self.key_label}] {self.tokens:.1f}"
