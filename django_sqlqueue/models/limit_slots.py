"""``queue_limit_slots``: the running slots of ``max_running`` limits, one row per slot.

A scope limited to N running handlers has rows numbered 0..N-1 (per key for per-key
limits: rows of the keys running lately, swept when idle). A worker takes a free row
(no holder, or a holder whose lease ran out) with ``FOR UPDATE SKIP LOCKED`` in its poll
transaction, so a slot is taken exactly when the message's delivery commits, and never
waited for; it gives the row back when the handler's outcome is recorded. A holder's
rows expire one lease duration after its last renewal, so a crashed worker's slots come
back by themselves, and at once where its liveness lock shows its process gone (see
:meth:`LimitSlotManager.lock_free`). Times are epoch ms by the database clock.

``idle_since`` says, of a free row, since when it is free (per-key rows idle long are
swept); of a held row, since when the worker that asked for it waits (0: nobody does),
which tells its holder to give it back rather than pass it on (see ``worker/handover.py``).

Turns at a full limit: ``held_since`` is when the row was taken, and a waiting worker asks
back the row held longest, so the slots go round the workers in order. ``wanted_by`` names
the worker that asked: the row, once given back, is free for that worker alone for
``RESERVED_MS``, so the worker waiting longest gets it, not whichever looks first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from django.db import connections, models
from django.db.models.expressions import RawSQL

from ..db import sql as sqlb
from ..db.liveness import held_sql
from .fields import KEY_LENGTH, SCOPE_LENGTH

DIGEST_LENGTH = 40  # hex SHA-1 of a key; '' for a scope's own (keyless) limit
# A row given back to the worker that asked for it is left to that worker this long (ms):
# it looks for it every 50 ms, and a worker that died meanwhile costs no more than this.
RESERVED_MS = 500


def _dead_holder_sql(connection: Any) -> str:
    """SQL true for a slot row whose holder advertised its liveness lock and no session
    holds it: the holder's process is gone."""
    q = connection.ops.quote_name
    holder = f"{q('queue_limit_slots')}.{q('holder')}"
    return (f"({holder} <> '' AND EXISTS (SELECT 1 FROM {q('queue_subscriber_heartbeats')} h "  # noqa: S608 - names quoted
            f"WHERE h.{q('liveness_token')} = {holder}) AND NOT {held_sql(connection, holder)})")


def key_digest(key: str) -> str:
    """The stored form of a limit key: fixed length and plain ASCII, so keys of any length
    and bytes compare exactly on every backend."""
    if not key:
        return ""
    return hashlib.sha1(key.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()


class LimitSlotManager(models.Manager["LimitSlot"]):
    """SQL for ``queue_limit_slots``."""

    def ensure(self, scope: str, key: str, count: int, now_ms: int, using: str) -> None:
        """Make rows 0..count-1 of (scope, key) exist (free), inserting only missing ones."""
        digest = key_digest(key)
        have = set(self.using(using).filter(scope=scope, limit_key=digest, slot__lt=count)
                   .values_list("slot", flat=True))
        missing = [n for n in range(count) if n not in have]
        if not missing:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        prefix, suffix = sqlb.insert_ignore(connection, ("scope", "limit_key", "slot"))
        columns = ", ".join(q(c) for c in ("scope", "limit_key", "key_label", "slot", "holder",
                                            "held_for", "expires_at", "idle_since"))
        values = ", ".join(["(%s, %s, %s, %s, '', '', 0, %s)"] * len(missing))
        params: list[object] = []
        for slot in missing:
            params += [scope, digest, key[:KEY_LENGTH], slot, now_ms]
        sqlb.execute(connection,
                     f"{prefix} {q('queue_limit_slots')} ({columns}) VALUES {values}{suffix}",  # noqa: S608 - names quoted, values bound
                     params)

    def lock_free(self, scope: str, key: str, count: int, wanted: int, now_ms: int,
                  using: str, holder: str = "",
                  still_used: Sequence[int] = (),
                  judge_liveness: bool = False) -> list[tuple[int, int]]:
        """Up to ``wanted`` free slots below ``count`` of (scope, key), locked for this
        transaction, lowest first, as (row id, slot). Rows other transactions hold are
        passed over: a worker never waits for another's slots. So are rows given back
        moments ago to another worker that asked for them (``holder`` is the asking
        worker's token), and ``still_used``: rows the worker lost (its lease ran out) whose
        handler still runs there, which it must not hold a second time.

        With ``judge_liveness``, a row held by a worker whose process is gone is free too,
        before its time runs out: its holder advertised its liveness lock (a heartbeat
        carries its token as ``liveness_token``) and no session holds that lock any more
        (see :mod:`django_sqlqueue.db.liveness`). A worker only paused keeps its lock, and
        its slots until they expire."""
        reserved_elsewhere = (~models.Q(wanted_by="") & ~models.Q(wanted_by=holder)
                              & models.Q(idle_since__gte=now_ms - RESERVED_MS))
        free = models.Q(holder="") | models.Q(expires_at__lt=now_ms)
        if judge_liveness:
            free |= models.Q(RawSQL(_dead_holder_sql(connections[using]), [],  # noqa: S611 - constant SQL
                                    output_field=models.BooleanField()))
        rows = (
            self.using(using).select_for_update(skip_locked=True)
            .filter(scope=scope, limit_key=key_digest(key), slot__lt=count)
            .filter(free)
            .exclude(reserved_elsewhere)
            .exclude(id__in=list(still_used))
            .order_by("slot").values_list("id", "slot")[:wanted]
        )
        return [(int(i), int(s)) for i, s in rows]

    def take(self, row_id: int, holder: str, held_for: str, expires_at: int, now_ms: int,
             using: str) -> None:
        self.using(using).filter(id=row_id).update(holder=holder, held_for=held_for[:255],
                                                   expires_at=expires_at, idle_since=0,
                                                   held_since=now_ms, wanted_by="")

    def want(self, scope: str, key: str, count: int, holder: str, since_ms: int, now_ms: int,
             using: str) -> int:
        """Ask for one slot below ``count`` of (scope, key) that another worker holds, for
        ``holder``, waiting since ``since_ms``: the slot held longest that nobody asked for,
        or, with every held slot asked for, the one whose asker has waited least (the ask
        passes to ``holder`` if it has waited longer). The asks go to the workers waiting
        longest, one each (nothing while a row asked for by ``holder`` is still held or
        reserved for it), so the slots go round in turn, never all to one worker."""
        rows = self.using(using).filter(scope=scope, limit_key=key_digest(key), slot__lt=count)
        pending = ~models.Q(holder="") | models.Q(idle_since__gte=now_ms - RESERVED_MS)
        if rows.filter(pending, wanted_by=holder).exists():
            return 0
        others = rows.exclude(holder="").exclude(holder=holder)
        row_id = (others.filter(idle_since=0).order_by("held_since", "slot")
                  .values_list("id", flat=True).first())
        if row_id is None:
            row_id = (others.filter(idle_since__gt=since_ms).order_by("-idle_since", "slot")
                      .values_list("id", flat=True).first())
        if row_id is None:
            return 0
        return (others.filter(id=row_id)
                .filter(models.Q(idle_since=0) | models.Q(idle_since__gt=since_ms))
                .update(idle_since=since_ms, wanted_by=holder))

    def unwant(self, scope: str, key: str, holder: str, using: str) -> int:
        """Withdraw ``holder``'s asks on (scope, key): it got a slot another way."""
        rows = self.using(using).filter(scope=scope, limit_key=key_digest(key), wanted_by=holder)
        withdrawn = rows.exclude(holder="").update(idle_since=0, wanted_by="")
        return withdrawn + rows.filter(holder="").update(wanted_by="")

    def wanted(self, row_ids: Sequence[int], holder: str, using: str) -> list[int]:
        """Which of ``holder``'s rows among ``row_ids`` another worker waits for."""
        if not row_ids:
            return []
        return list(self.using(using).filter(id__in=list(row_ids), holder=holder,
                                             idle_since__gt=0).values_list("id", flat=True))

    def held(self, row_ids: Sequence[int], holder: str, using: str) -> list[int]:
        """Which of ``row_ids`` ``holder`` still holds."""
        if not row_ids:
            return []
        return list(self.using(using).filter(id__in=list(row_ids), holder=holder)
                    .values_list("id", flat=True))

    def give_back(self, row_ids: Sequence[int], holder: str, now_ms: int, using: str) -> int:
        """Free ``holder``'s rows among ``row_ids`` (a row whose lease ran out and that
        another worker took since is left alone)."""
        if not row_ids:
            return 0
        return (self.using(using).filter(id__in=list(row_ids), holder=holder)
                .update(holder="", held_for="", expires_at=0, idle_since=now_ms))

    def renew(self, row_ids: Sequence[int], holder: str, expires_at: int, using: str) -> int:
        """Push back the expiry of ``holder``'s rows (with the worker's lease renewals)."""
        if not row_ids:
            return 0
        return (self.using(using).filter(id__in=list(row_ids), holder=holder)
                .update(expires_at=expires_at))

    def sweep(self, idle_before_ms: int, using: str) -> int:
        """Delete per-key rows free since before ``idle_before_ms`` (or whose holder's lease
        ran out then): rows exist only for keys running lately."""
        return (self.using(using).exclude(limit_key="")
                .filter(models.Q(holder="", idle_since__lt=idle_before_ms)
                        | models.Q(expires_at__gt=0, expires_at__lt=idle_before_ms))
                .delete()[0])

    def usage(self, now_ms: int, using: str) -> list[dict[str, Any]]:
        """Per scope: the slots of its own limit (its max_running) and how many run, the
        keys running with the slots they hold, and the highest per-key slot number + 1
        (its max_running_per_key), from a few rows per key running lately."""
        live = models.Q(expires_at__gte=now_ms) & ~models.Q(holder="")
        own, keyed = models.Q(limit_key=""), ~models.Q(limit_key="")
        rows = (self.using(using).values("scope")
                .annotate(slots=models.Count("id", filter=own),
                          running=models.Count("id", filter=live & own),
                          keys_running=models.Count("limit_key", distinct=True, filter=live & keyed),
                          key_slots_running=models.Count("id", filter=live & keyed),
                          per_key=models.Max("slot", filter=keyed))
                .order_by("scope"))
        return [dict(row) for row in rows]


class LimitSlot(models.Model):
    """One slot of a ``max_running`` limit (``queue_limit_slots``)."""

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=SCOPE_LENGTH)
    limit_key = models.CharField(max_length=DIGEST_LENGTH, default="", blank=True)
    key_label = models.CharField(max_length=KEY_LENGTH, default="", blank=True)  # the key, for people
    slot = models.IntegerField()
    holder = models.CharField(max_length=64, default="", blank=True)  # a worker's fencing token
    held_for = models.CharField(max_length=255, default="", blank=True)  # the message, for people
    expires_at = models.BigIntegerField(default=0)
    idle_since = models.BigIntegerField(default=0)
    held_since = models.BigIntegerField(db_default=0)  # when taken (epoch ms)
    wanted_by = models.CharField(max_length=64, db_default="", blank=True)  # who asked for it

    objects = LimitSlotManager()

    class Meta:
        db_table = "queue_limit_slots"
        constraints = [
            models.UniqueConstraint(fields=["scope", "limit_key", "slot"],
                                    name="queue_limit_slot_unique"),
        ]
        indexes = [models.Index(fields=["holder", "idle_since"], name="queue_limit_slot_idle")]

    def __str__(self) -> str:
        return f"{self.scope}[{self.key_label}]#{self.slot}"
