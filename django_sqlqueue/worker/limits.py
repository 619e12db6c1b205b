"""Fleet-wide limits in the poll cycle: slots taken as messages go out, given back as their
outcomes are recorded, and messages over a limit held back.

Each message a cycle hands out may need *claims* (see
:mod:`django_sqlqueue.consuming.limits`): a slot of a ``max_running`` scope, a token of a
``rate`` scope. Just before the cycle writes its deliveries, the gate locks what the
cycle's messages need (free slot rows, the scopes' buckets; rows other workers' cycles
hold are passed over, never waited for), gives each message all of its claims or none,
and writes what was taken, all in the cycle's transaction: a slot is held exactly when
the delivery commits. A message that gets none is *held*: it is not delivered (its
attempts do not change), stays its key's head, and is tried again shortly, or at once
when this worker frees a slot of its scope. Other keys, partitions and subscriptions go
on as before.

A worker keeps its slots while it has more work of their scope: a message denied a slot
is delivered anyway, to wait in the worker for one of the slots it holds, when fewer
than two per slot wait (one ``max_running`` claim and no rate only); see :mod:`.handover`.

Unless another worker waits for them: the slots rotate. A cycle that finds a limit full
while it has messages of it asks for the slot another worker has held longest, marking it
*wanted* (after its commit, at most every ``WANT_EVERY_MS``, one slot per waiting worker at
a time, the workers waiting longest first), and looks again every ``WANT_RETRY_MS`` while
it waits; the slot, given back, is left to it for a moment (``RESERVED_MS``), so workers
are served in the order they began to wait. The holders read which of their slots are wanted at
most every ``WANTED_CHECK_MS``; a wanted slot held ``MIN_TENURE`` goes back to the
database at its handler's end, and its holder leaves the scope alone for
``HELD_RETRY_MS``, so the waiting worker takes it. Inside a worker, the partitions whose
messages got a slot (or a place to wait) least recently go first.

Handlers holding a slot of a scope's own ``max_running`` run on threads of their own (see
:mod:`.dispatcher`), as many as the worker's concurrency: a worker takes no more such
slots than that (``max_own``), so a slot is rarely held by a handler waiting for a thread,
and the other workers get the rest; but it always may take one slot of a scope it holds
none of, so that a scope keeping its slots busy never leaves another waiting for its
whole backlog.

Slots carry an expiry renewed with the worker's lease renewals, so a crashed worker's
slots come back within one lease duration.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from django.db import transaction

from ..consuming.limits import Claim, SubscriptionLimits
from ..consuming.message import Message
from ..consuming.registry import Subscription
from ..models import LimitBucket, LimitSlot
from .handover import DEADLINE_MARGIN, WAITING_PER_SLOT, LocalSlots, Ref, Scope, Slot
from .limit_scopes import HELD_RETRY_MS, Candidate, LockedScope, Need
from .partitions import Ident, Partition
from .window import Entry

logger = logging.getLogger("django_sqlqueue.worker")

# Per-key rows free (or expired) for this long are deleted (ms): rows exist for the keys
# running lately, not for every key ever seen.
KEY_IDLE_MS = 30_000
SWEEP_INTERVAL_MS = 10_000
# A scope's slot rows are made sure of (inserted if missing) once; when every one is found
# taken, again after this long (ms): rows go missing only when the table is emptied by hand,
# and a full limit is the common case, not worth a statement per cycle.
ENSURE_AGAIN_MS = 10_000
# Held messages remembered per scope to wake when a slot frees here (memory bound).
MAX_REMEMBERED = 10_000
# A worker waiting for slots others hold looks again this soon (ms): a slot given back
# to it stays free about this long at most.
WANT_RETRY_MS = 50
# ... and marks them wanted at most this often (ms): a mark lasts until the slot changes
# hands.
WANT_EVERY_MS = 200
# A worker holding slots reads which are wanted at most this often (ms).
WANTED_CHECK_MS = 200


class LimitGate:
    """One worker's side of the limits: the slots it holds, and its held messages."""

    def __init__(self, token: str, lease_ms: int, using: str,
                 max_own: int | None = None,
                 sharers: Callable[[Subscription], int] | None = None,
                 judging: Callable[[], bool] | None = None) -> None:
        self.token = token  # the worker's fencing token: the holder of its slots
        # Whether a slot whose holder's liveness lock is gone counts as free (see
        # LimitSlot.objects.lock_free): as the worker's leasing judges other workers.
        self.judging = judging or (lambda: False)
        # How many workers consume a subscription (this one included), as last counted:
        # they share its bucket's refill.
        self._sharers = sharers
        # The most slots of scopes' own limits (not per key) held here at once: the
        # threads limited handlers run on (None: no bound).
        self.max_own = max_own
        self.lease_ms = lease_ms
        self.using = using
        # The slots held, by delivery, and the messages waiting here for one of them.
        self.local = LocalSlots()
        # Messages held for a slot, by scope: made due at once when a slot of it frees here.
        self._held: dict[Scope, dict[tuple[Ident, int], tuple[Partition, Entry]]] = (
            defaultdict(dict))
        # (scope, count) whose rows are known to exist, and when they were made sure of (ms).
        self._ensured: dict[tuple[str, int], int] = {}
        # Each rated scope's tokens when this worker last saw its bucket, and when (ms).
        self._tokens_seen: dict[Scope, tuple[float, int]] = {}
        # Scopes whose slots were all taken at this worker's last try, and when (ms): until
        # HELD_RETRY_MS later, or a slot of it frees here, nothing of it is handed out.
        self._full_at: dict[str, int] = {}
        # Scopes whose slots this worker waits for, and when it last marked them wanted (ms).
        self._wanting: dict[Scope, int] = {}
        self._waiting_since: dict[Scope, int] = {}  # ... and since when it waits (ms)
        self._next_wanted_check = 0
        # When a message of each partition last got a slot or a place to wait (a counter):
        # the partitions served least recently go first.
        self._served: dict[Ident, int] = {}
        self._serve_order = 0
        self._next_sweep = 0

    def _retry_ms(self, scope: Scope) -> int:
        """How soon a message held for ``scope``'s slots is tried again."""
        return WANT_RETRY_MS if scope in self._wanting else HELD_RETRY_MS

    @property
    def running(self) -> int:
        return self.local.count()

    def own_room(self) -> int | None:
        """How many more slots of scopes' own limits this worker may take (None: any)."""
        return None if self.max_own is None else max(0, self.max_own - self.local.own_count())

    # ------------------------------------------------------------------ in the poll cycle

    def hand_out_cap(self, subscription: Subscription, now_ms: int) -> tuple[int | None, int]:
        """Messages of ``subscription`` worth handing out this cycle (None: no cap), and
        when a cap of 0 may be more. The cap is its max_running (or the slots this worker
        may still take), plus what may wait here for a slot it holds, and the tokens its
        bucket holds by now, as far as this worker knows. More would only be read, held
        back and written as holds."""
        limits = subscription.limits
        if not isinstance(limits, SubscriptionLimits):
            return None, now_ms
        caps = []
        when = now_ms
        if limits.max_running is not None:
            full_at = self._full_at.get(limits.scope)
            retry_ms = self._retry_ms((limits.scope, ""))
            recently_full = full_at is not None and now_ms - full_at < retry_ms
            room = self.own_room()
            if recently_full:
                takeable = 0
            elif room is None or room > 0:
                takeable = limits.max_running if room is None else min(limits.max_running, room)
            else:
                takeable = 0 if self.local.holds((limits.scope, "")) else 1
            cap = takeable + self.local.openings((limits.scope, ""))
            caps.append(cap)
            if cap == 0:
                # Tried again when the full limit is looked at again, or, when this worker
                # holds all it may, after a while (a slot it frees wakes what it held
                # back sooner: see release()).
                looked = full_at if full_at is not None and recently_full and room != 0 else now_ms
                when = max(when, looked + retry_ms)
        if limits.rate is not None:
            seen = self._tokens_seen.get((limits.scope, ""))
            if seen is None:
                caps.append(limits.rate.count)
            else:
                # Tokens left at this worker's last look, and its part of the refill since:
                # the other workers consuming the subscription take theirs. Looking sooner
                # would mostly find the bucket empty (and hold back what was read).
                tokens, at = seen
                per_ms = limits.rate.per_ms / max(1, self._sharers(subscription)
                                                  if self._sharers is not None else 1)
                refilled = tokens + max(0, now_ms - at) * per_ms
                cap = math.floor(min(limits.rate.count, refilled))
                caps.append(cap)
                if cap == 0:
                    when = max(when, now_ms + max(1, math.ceil((1 - refilled) / per_ms)))
        return (min(caps) if caps else None), when

    def release(self, now_ms: int) -> None:
        """Give back the slots whose handler finished with no message waiting here for
        them, and make the messages held for scopes with a slot to be had due now: those
        given back, and those with room to wait here for a slot this worker holds."""
        self._check_wanted(now_ms)
        slots, yielded = self.local.returnable()
        freed = {s.scope for s in slots} - yielded
        if slots:
            ids = [s.row_id for s in slots]
            LimitSlot.objects.give_back(ids, self.token, now_ms, self.using)
            transaction.on_commit(lambda: self.local.returned(ids), using=self.using)
            for scope in freed:
                self._full_at.pop(scope[0], None)
            for name, _ in yielded:
                # Given back for a worker waiting for it: not taken again here before that
                # worker has looked (it looks every WANT_RETRY_MS).
                self._full_at[name] = now_ms
        for scope in list(self._held):
            # As many as may wait here (the longest held first): the others would only be
            # read, held back and written as holds again.
            wanted = len(self._held[scope]) if scope in freed else self.local.openings(scope)
            held = self._held[scope]
            while wanted > 0 and held:
                partition, entry = held.pop(next(iter(held)))
                if partition.entries.get(entry.offset) is entry and entry.state == "waiting":
                    partition.hold_until(entry, now_ms)
                    wanted -= 1
            if not held:
                del self._held[scope]

    def _check_wanted(self, now_ms: int) -> None:
        """Now and then, read which of the slots held here other workers wait for."""
        if now_ms < self._next_wanted_check:
            return
        self._next_wanted_check = now_ms + WANTED_CHECK_MS
        ids = self.local.row_ids()
        self.local.want(LimitSlot.objects.wanted(ids, self.token, self.using) if ids else [])

    def admit(self, candidates: Sequence[Candidate], now_ms: int) -> list[Candidate]:
        """Take what ``candidates`` need; return those held back (not to be delivered now),
        each rescheduled in its partition."""
        deadline = time.monotonic() + self.lease_ms / 1000 - DEADLINE_MARGIN
        # The partitions served least recently first: a partition listed first in every
        # cycle would otherwise take every slot and every place to wait.
        candidates = sorted(candidates, key=lambda c: (
            0 if c.partition.subscription.priority_of is not None
            else self._served.get(c.partition.ident, 0)))
        claimed = []
        needs: dict[Scope, Need] = defaultdict(Need)
        for candidate in candidates:
            limits = candidate.partition.subscription.limits
            claims = () if limits is None else limits.claims(candidate.message)
            if not claims:
                continue
            claimed.append((candidate, claims))
            for claim in claims:
                need = needs[(claim.scope, claim.key)]
                need.count += 1
                need.max_running = max(need.max_running, claim.max_running or 0)
                need.rate = need.rate or claim.rate
        if not claimed:
            return []
        # Scopes in one order in every worker: two cycles creating rows never wait for
        # each other in a circle.
        states = {scope: (LockedScope() if self._only_waiting(scope, needs[scope], claimed, now_ms)
                          else self._lock(scope, needs[scope], now_ms))
                  for scope in sorted(needs)}
        held: list[Candidate] = []
        taken: list[tuple[Candidate, list[Slot]]] = []
        to_wait: dict[Ref, Scope] = {}  # delivered to wait for a slot held here
        # Per scope: how many more may wait for a slot held here, or taken by this cycle.
        openings: dict[Scope, int] = {}
        room = self.own_room()
        gotten: set[Scope] = set()  # scopes of own slots this cycle takes
        for candidate, claims in claimed:
            scopes = [(c.scope, c.key) for c in claims]
            own = next(((c.scope, c.key) for c in claims
                        if c.max_running is not None and not c.key), None)
            roomy = (room is None or room > 0 or own is None
                     or (own not in gotten and not self.local.holds(own)))
            if roomy and all(states[s].can(c) for s, c in zip(scopes, claims, strict=True)):
                if own is not None:
                    gotten.add(own)
                    if room is not None and room > 0:
                        room -= 1
                rows = [(states[s].take(c), s) for s, c in zip(scopes, claims, strict=True)]
                taken.append((candidate, [Slot(r, s, deadline) for r, s in rows
                                          if r is not None]))
                self._serve(candidate)
                for row_id, scope in rows:
                    if row_id is not None:
                        openings[scope] = self._openings(openings, scope) + WAITING_PER_SLOT
                continue
            if _may_wait(claims):
                scope = scopes[0]
                openings[scope] = self._openings(openings, scope)
                if openings[scope] > 0:
                    openings[scope] -= 1
                    to_wait[ref_of(candidate.partition, candidate.message)] = scope
                    self._serve(candidate)
                    continue
            due = max(states[s].retry_at(c, now_ms, self._retry_ms(s))
                      for s, c in zip(scopes, claims, strict=True))
            if not roomy:
                due = max(due, now_ms + HELD_RETRY_MS)  # or when a slot frees here
            candidate.partition.hold_until(candidate.entry, due)
            for scope, claim in zip(scopes, claims, strict=True):
                if claim.max_running is not None:
                    waiting = self._held[scope]
                    if len(waiting) >= MAX_REMEMBERED:
                        waiting.clear()  # they are tried again on their own timers anyway
                    waiting[(candidate.partition.ident, candidate.entry.offset)] = (
                        candidate.partition, candidate.entry)
            held.append(candidate)
        for candidate, slots in taken:
            for slot in slots:
                LimitSlot.objects.take(slot.row_id, self.token, _label(candidate),
                                       now_ms + self.lease_ms, now_ms, self.using)
        for scope, state in states.items():
            need = needs[scope]
            if state.bucket is not None:
                self._tokens_seen[scope] = (state.bucket.tokens, now_ms)
            if state.taken_tokens and state.bucket is not None and need.rate is not None:
                LimitBucket.objects.save_tokens(state.bucket, need.rate.count, need.rate.per_ms,
                                                now_ms, self.using)
        committed = {ref_of(c.partition, c.message): slots for c, slots in taken if slots}
        if committed or to_wait:
            transaction.on_commit(lambda: self.local.taken(committed, to_wait), using=self.using)
        return held

    def _serve(self, candidate: Candidate) -> None:
        self._serve_order += 1
        self._served[candidate.partition.ident] = self._serve_order
        if len(self._served) > MAX_REMEMBERED:
            self._served.clear()

    def _openings(self, openings: dict[Scope, int], scope: Scope) -> int:
        found = openings.get(scope)
        return self.local.openings(scope) if found is None else found

    def _only_waiting(self, scope: Scope, need: Need,
                      claimed: Sequence[tuple[Candidate, Sequence[Claim]]], now_ms: int) -> bool:
        """Whether the cycle may leave ``scope``'s rows alone: its whole limit was taken at
        this worker's last try, moments ago (so a free slot is unlikely, and other workers
        are tried again on their own timers), and each of its messages can only wait here
        for a slot this worker holds, or be held. The cycles that keep a worker's slots
        supplied then send no statement for the limit."""
        name, key = scope
        full_at = self._full_at.get(name)
        if key or need.rate is not None or full_at is None or (
                now_ms - full_at >= self._retry_ms(scope)):
            return False
        return all(_may_wait(claims) for _, claims in claimed
                   if any((c.scope, c.key) == scope for c in claims))

    def _lock(self, scope: Scope, need: Need, now_ms: int) -> LockedScope:
        name, key = scope
        state = LockedScope()
        if need.max_running:
            ensured = (name, need.max_running)
            if key or ensured not in self._ensured:
                LimitSlot.objects.ensure(name, key, need.max_running, now_ms, self.using)
                if not key:
                    self._ensured[ensured] = now_ms
            # Never a row still tracked here: a slot lost while its handler ran, taken
            # again, would be given back at that handler's end under the new holding.
            state.free = LimitSlot.objects.lock_free(name, key, need.max_running, need.count,
                                                     now_ms, self.using, holder=self.token,
                                                     still_used=self.local.row_ids(),
                                                     judge_liveness=self.judging())
            if not state.free and not key and now_ms - self._ensured.get(ensured, now_ms) >= (
                    ENSURE_AGAIN_MS):
                # All taken, or the rows are gone (a table emptied by hand): make sure
                # they exist next time.
                del self._ensured[ensured]
            if not key:
                if len(state.free) < need.count:
                    self._full_at[name] = now_ms
                else:
                    self._full_at.pop(name, None)
            self._note_waiting(scope, need, bool(state.free), now_ms)
        if need.rate is not None:
            state.bucket = LimitBucket.objects.lock(name, key, str(need.rate), need.rate.count,
                                                    need.rate.per_ms, now_ms, self.using)
            state.bucket_busy = state.bucket is None
        return state

    def _note_waiting(self, scope: Scope, need: Need, got: bool, now_ms: int) -> None:
        """After a look at ``scope``'s free slots: a worker that found none and holds none
        of its own waits for the others' (and marks them wanted); one that found some no
        longer waits."""
        if got or self.local.holds(scope):
            self._waiting_since.pop(scope, None)
            if self._wanting.pop(scope, None) is not None:
                # Served: a slot it asked another worker for is not needed any more.
                name, key = scope
                transaction.on_commit(
                    lambda: LimitSlot.objects.unwant(name, key, self.token, self.using),
                    using=self.using)
            return
        if len(self._wanting) > MAX_REMEMBERED:
            self._wanting.clear()  # per-key scopes no longer seen: marked again if need be
            self._waiting_since.clear()
        marked = self._wanting.get(scope)
        if marked is None:
            self._waiting_since[scope] = now_ms
            marked = now_ms - WANT_EVERY_MS
        self._wanting[scope] = marked
        if now_ms - marked < WANT_EVERY_MS:
            return
        self._wanting[scope] = now_ms
        name, key = scope
        since = self._waiting_since.get(scope, now_ms)
        # After the cycle commits, on its own: the UPDATE may wait for a holder's short
        # transaction, and must not while this cycle holds its rows.
        transaction.on_commit(
            lambda: LimitSlot.objects.want(name, key, need.max_running, self.token, since,
                                           now_ms, self.using), using=self.using)

    # ------------------------------------------------------------------ with the renewals

    def renew(self, now_ms: int) -> None:
        """Push back the expiry of the slots this worker holds, and now and then delete
        per-key rows of keys idle for a while (its own transaction each)."""
        ids = self.local.row_ids()
        if ids:
            # Confirmed rows are surely this worker's until this moment plus a lease: taken
            # before the renewal was sent, so a slow round trip only shortens it.
            renewing_at = time.monotonic()
            renewed = LimitSlot.objects.renew(ids, self.token, now_ms + self.lease_ms,
                                              self.using)
            kept = ids if renewed == len(ids) else LimitSlot.objects.held(ids, self.token,
                                                                           self.using)
            lost = set(ids) - set(kept)
            if lost:
                # Its lease ran out and another worker took it (the worker was paused, or
                # cut off): nothing more starts under it here.
                logger.warning("limit slots lost to another worker, not used any more "
                               "rows=%s", sorted(lost))
                self.local.lose(lost)
            self.local.renewed(kept, renewing_at + self.lease_ms / 1000 - DEADLINE_MARGIN)
        if now_ms >= self._next_sweep:
            self._next_sweep = now_ms + SWEEP_INTERVAL_MS
            LimitSlot.objects.sweep(now_ms - KEY_IDLE_MS, self.using)
            LimitBucket.objects.sweep(now_ms, self.using)

    def release_all(self, now_ms: int) -> None:
        """Give back every slot (the worker stops)."""
        ids = self.local.row_ids()
        if ids:
            LimitSlot.objects.give_back(ids, self.token, now_ms, self.using)
        self.local.clear()


def ref_of(partition: Partition, message: Message) -> Ref:
    return (partition.ident, message.offset, message.attempt)


def _may_wait(claims: Sequence[Claim]) -> bool:
    """Whether a message denied a slot may wait in the worker for one it holds: it needs
    one slot and no token (a token is spent when taken: a wait would shift the start)."""
    return len(claims) == 1 and claims[0].max_running is not None and claims[0].rate is None


def _label(candidate: Candidate) -> str:
    return f"{candidate.partition.topic}/{candidate.partition.number}@{candidate.entry.offset}"
