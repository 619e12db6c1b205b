"""The ``max_running`` slots one worker holds, and their hand-over from a finished handler
to the next message of the scope without a poll cycle.

A worker keeps a slot while it has more work of the slot's scope: the poll cycle may
deliver up to two messages more per slot held (*waiting* messages: their deliveries are
written, no slot row is taken for them), and the moment a local handler of the scope finishes, its
slot passes to the oldest waiting message, which starts at once, on the handler's thread.
No database round trip is needed at hand-over, and fleet-wide no more handlers run than
slots are held: a handler starts only with a slot. A slot whose handler finished with no
message waiting is *idle*; the next poll cycle gives it back, so other workers get it.

A slot is kept this way only while it is surely held and nobody else waits for it:

* **Fenced by time.** Each slot has a local deadline (``time.monotonic()``): when it was
  taken or last renewed, plus the lease, less a margin. No handler starts under a slot
  past it, nor under one a renewal found taken by another worker (*lost*): a worker paused
  past its lease never starts a handler on a slot another worker may hold.
* **Rotated.** A slot another worker waits for (see :mod:`.limits`), held here for
  ``MIN_TENURE`` at least, goes back at its handler's end instead of on to the next
  message; the messages waiting here beyond what the slots left can take are given back
  to their partitions (undelivered, no attempt counted).

Handler threads finish handlers; the worker's main thread does the rest (the poll cycle,
submitting deliveries): all state is behind one lock.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .partitions import Ident

# Messages that may wait per slot held: two, so that the poll cycle delivering the next
# one has a whole handler's run to commit, however slow it is under load.
WAITING_PER_SLOT = 2
# A slot another worker waits for goes back once held this long (seconds): the slot's
# idle moment while it changes hands (about one poll cycle of each worker) stays a few
# per cent of its time, however short the handlers, and a waiting worker's turn comes
# within a second (docs/consuming.md, "Slots rotate").
MIN_TENURE = 0.5
# A slot is not used later than this before its lease could run out (seconds): the
# database clocks of two workers, and a thread's start, differ by less.
DEADLINE_MARGIN = 0.5

Ref = tuple[Ident, int, int]  # (partition, offset, attempt): one delivery
Scope = tuple[str, str]  # (scope, key)
Start = Callable[[], None]  # starts a waiting message's handler
Drop = Callable[[], None]  # gives a waiting message back to its partition, not started


@dataclass
class Slot:
    row_id: int
    scope: Scope
    # time.monotonic() past which no handler starts under it (lease out, less a margin).
    deadline: float = math.inf
    taken_at: float = field(default_factory=time.monotonic)


class LocalSlots:
    """Which delivery holds each slot this worker holds, and the messages waiting for one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: dict[Ref, list[Slot]] = {}  # queued, running or just finished handlers
        self._idle: dict[Scope, list[Slot]] = defaultdict(list)  # finished, nothing waiting
        self._waiting: dict[Scope, deque[tuple[Ref, Start, Drop]]] = defaultdict(deque)
        self._expected: dict[Ref, Scope] = {}  # waiting deliveries committed, not yet submitted
        self._going: set[int] = set()  # idle rows the current cycle gives back
        # Finished, not handed on (wanted elsewhere, or past its deadline): given back by
        # the next cycle, never handed on again.
        self._retiring: list[Slot] = []
        self._wanted: set[int] = set()  # rows another worker waits for
        self._lost: set[int] = set()  # rows a renewal found another worker's

    def count(self) -> int:
        with self._lock:
            return len(self._slots()) + len(self._retiring)

    def row_ids(self) -> list[int]:
        """Every row held here (retiring ones too: they are given back by a cycle)."""
        with self._lock:
            return [s.row_id for s in [*self._slots(), *self._retiring]]

    def own_count(self) -> int:
        """Slots of scopes' own limits (``max_running``, not per key) held here."""
        with self._lock:
            return sum(1 for s in [*self._slots(), *self._retiring]
                       if not s.scope[1] and s.row_id not in self._going)

    def holds(self, scope: Scope) -> bool:
        """Whether this worker holds a slot of ``scope`` (one it keeps)."""
        now = time.monotonic()
        with self._lock:
            return any(s.scope == scope and self._usable(s, now)
                       for slots in self._busy.values() for s in slots) or any(
                s.row_id not in self._going and self._usable(s, now)
                for s in self._idle.get(scope, ()))

    def holds_own(self, ref: Ref) -> bool:
        """Whether the delivery ``ref`` holds a slot of a scope's own limit (and so runs
        on the worker's threads for limited handlers)."""
        with self._lock:
            return any(not s.scope[1] for s in self._busy.get(ref, ()))

    def openings(self, scope: Scope) -> int:
        """Messages of ``scope`` the cycle may deliver to wait for a slot held here."""
        now = time.monotonic()
        with self._lock:
            # Slots that may go on to a waiting message: surely held, and nobody else's
            # turn yet.
            held = sum(1 for slots in self._busy.values() for s in slots if s.scope == scope
                       and self._passing(s, now))
            held += sum(1 for s in self._idle.get(scope, ()) if s.row_id not in self._going
                        and self._passing(s, now))
            waiting = len(self._waiting.get(scope, ()))
            expected = sum(1 for s in self._expected.values() if s == scope)
            return max(0, held * WAITING_PER_SLOT - waiting - expected)

    # ------------------------------------------------------------------ the poll cycle

    def taken(self, slots: dict[Ref, list[Slot]], waiting: dict[Ref, Scope]) -> None:
        """A cycle committed: ``slots`` taken for its deliveries, and ``waiting`` delivered
        to wait for a slot held here."""
        with self._lock:
            for ref, held in slots.items():
                self._busy.setdefault(ref, []).extend(held)
            self._expected.update(waiting)

    def returnable(self) -> tuple[list[Slot], set[Scope]]:
        """The idle and retiring slots, for the cycle to give back (see returned()), and
        the scopes of those retiring because another worker waits for them (this worker
        leaves them alone for a moment)."""
        with self._lock:
            slots = [s for held in self._idle.values() for s in held] + self._retiring
            self._going = {s.row_id for s in slots}
            yielded = {s.scope for s in slots if s.row_id in self._wanted}
            return slots, yielded

    def returned(self, row_ids: Iterable[int]) -> None:
        """The cycle that gave these idle slots back committed."""
        gone = set(row_ids)
        with self._lock:
            for scope in list(self._idle):
                kept = [s for s in self._idle[scope] if s.row_id not in gone]
                if kept:
                    self._idle[scope] = kept
                else:
                    del self._idle[scope]
            self._retiring = [s for s in self._retiring if s.row_id not in gone]
            self._wanted -= gone
            self._lost -= gone
            self._going.clear()

    def clear(self) -> None:
        with self._lock:
            self._busy.clear()
            self._idle.clear()
            self._waiting.clear()
            self._expected.clear()
            self._retiring.clear()
            self._wanted.clear()
            self._lost.clear()

    # ------------------------------------------------------------------ with the renewals

    def want(self, row_ids: Iterable[int]) -> None:
        """Another worker waits for these rows: each goes back at its handler's end (once
        held MIN_TENURE)."""
        with self._lock:
            self._wanted = set(row_ids)

    def renewed(self, row_ids: Iterable[int], deadline: float) -> None:
        """A renewal confirmed these rows this worker's until ``deadline``."""
        confirmed = set(row_ids)
        with self._lock:
            for slot in self._slots():
                if slot.row_id in confirmed:
                    slot.deadline = max(slot.deadline, deadline)

    def lose(self, row_ids: Iterable[int]) -> None:
        """A renewal found these rows no longer this worker's: nothing more starts under
        them (a handler already running finishes), and what waits for them goes back."""
        lost = set(row_ids)
        drops: list[Drop] = []
        with self._lock:
            self._lost |= lost
            for slot in self._slots():
                if slot.row_id in lost:
                    slot.deadline = -math.inf
            for scope, slots in list(self._idle.items()):
                self._retiring += [s for s in slots if s.row_id in lost]
                kept = [s for s in slots if s.row_id not in lost]
                if kept:
                    self._idle[scope] = kept
                else:
                    del self._idle[scope]
            for scope in list(self._waiting):
                drops += self._excess(scope)
        for drop in drops:
            drop()

    def _slots(self) -> list[Slot]:
        return [s for slots in [*self._busy.values(), *self._idle.values()] for s in slots]

    def _usable(self, slot: Slot, now: float) -> bool:
        return slot.row_id not in self._lost and now < slot.deadline

    def _passing(self, slot: Slot, now: float) -> bool:
        """Whether the slot goes on to a waiting message at its handler's end: it is
        usable, and not yet another worker's turn."""
        return self._usable(slot, now) and not (
            slot.row_id in self._wanted and now - slot.taken_at >= MIN_TENURE)

    def _excess(self, scope: Scope) -> list[Drop]:
        """Take out the messages waiting for ``scope`` beyond what the usable slots held
        here may take (lock held); their drops, for the caller to run."""
        now = time.monotonic()
        usable = sum(1 for slots in self._busy.values() for s in slots
                     if s.scope == scope and self._passing(s, now))
        queue = self._waiting.get(scope)
        drops: list[Drop] = []
        while queue and len(queue) > usable * WAITING_PER_SLOT:
            drops.append(queue.pop()[2])
        if scope in self._waiting and not queue:
            del self._waiting[scope]
        return drops

    def may_start(self, ref: Ref) -> bool:
        """Whether the delivery ``ref`` may start its handler now: each slot it holds is
        this worker's and within its deadline."""
        now = time.monotonic()
        with self._lock:
            return all(self._usable(s, now) for s in self._busy.get(ref, ()))

    # ------------------------------------------------------------------ the handlers

    def defer(self, ref: Ref, start: Start, drop: Drop) -> bool:
        """Whether the delivery ``ref`` waits for a slot (``start`` runs it when one
        frees, ``drop`` gives it back if none will), or was given back at once; False:
        start it now (it holds its slots, or needs none)."""
        with self._lock:
            scope = self._expected.pop(ref, None)
            if scope is None:
                return False
            now = time.monotonic()
            idle = self._idle.get(scope)
            usable = [s for s in idle or () if self._usable(s, now)]
            if usable:
                slot = usable[-1]
                idle.remove(slot)  # type: ignore[union-attr]
                self._going.discard(slot.row_id)
                self._busy[ref] = [slot]
                return False
            self._waiting[scope].append((ref, start, drop))
            drops = self._excess(scope)
        for given_back in drops:
            given_back()
        return True

    def finished(self, ref: Ref) -> tuple[list[Start], bool]:
        """``ref``'s handler finished (or never started): pass each of its slots to the
        oldest message waiting for its scope, or leave it idle, or retire it (lost, past
        its deadline, or wanted elsewhere and held MIN_TENURE). Returns what to start, and
        whether every slot went on to a message with another still waiting behind it (so
        no poll cycle is needed yet to keep the slots busy)."""
        starts = []
        drops: list[Drop] = []
        supplied = True
        now = time.monotonic()
        with self._lock:
            slots = self._busy.pop(ref, ())
            for slot in slots:
                queue = self._waiting.get(slot.scope)
                if not self._passing(slot, now):
                    self._retiring.append(slot)
                    supplied = False
                    drops += self._excess(slot.scope)
                elif queue:
                    waiting, start, _ = queue.popleft()
                    if not queue:
                        del self._waiting[slot.scope]
                        supplied = False
                    self._busy[waiting] = [slot]
                    starts.append(start)
                else:
                    self._idle[slot.scope].append(slot)
                    supplied = False
        for drop in drops:
            drop()
        return starts, bool(slots) and supplied
