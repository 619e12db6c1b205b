"""The ``max_running`` slots one worker holds, and their hand-over from a finished handler
to the next message of the scope without a poll cycle.

A worker keeps a slot while it has more work of the slot's scope: the poll cycle may
deliver up to two messages more per slot held (*waiting* messages: their deliveries are
written, no slot row is taken for them), and the moment a local handler of the scope finishes, its
slot passes to the oldest waiting message, which starts at once, on the handler's thread.
No database round trip is needed at hand-over, and fleet-wide no more handlers run than
slots are held: a handler starts only with a slot. A slot whose handler finished with no
message waiting is *idle*; the next poll cycle gives it back, so other workers get it.

Handler threads finish handlers; the worker's main thread does the rest (the poll cycle,
submitting deliveries): all state is behind one lock.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .partitions import Ident

# Messages that may wait per slot held: two, so that the poll cycle delivering the next
# one has a whole handler's run to commit, however slow it is under load.
WAITING_PER_SLOT = 2

Ref = tuple[Ident, int, int]  # (partition, offset, attempt): one delivery
Scope = tuple[str, str]  # (scope, key)
Start = Callable[[], None]  # starts a waiting message's handler


@dataclass
class Slot:
    row_id: int
    scope: Scope


class LocalSlots:
    """Which delivery holds each slot this worker holds, and the messages waiting for one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: dict[Ref, list[Slot]] = {}  # queued, running or just finished handlers
        self._idle: dict[Scope, list[Slot]] = defaultdict(list)  # finished, nothing waiting
        self._waiting: dict[Scope, deque[tuple[Ref, Start]]] = defaultdict(deque)
        self._expected: dict[Ref, Scope] = {}  # waiting deliveries committed, not yet submitted
        self._going: set[int] = set()  # idle rows the current cycle gives back

    def count(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._busy.values()) + sum(
                len(s) for s in self._idle.values())

    def row_ids(self) -> list[int]:
        with self._lock:
            return [s.row_id for slots in [*self._busy.values(), *self._idle.values()]
                    for s in slots]

    def own_count(self) -> int:
        """Slots of scopes' own limits (``max_running``, not per key) held here."""
        with self._lock:
            return sum(1 for slots in [*self._busy.values(), *self._idle.values()]
                       for s in slots if not s.scope[1] and s.row_id not in self._going)

    def holds(self, scope: Scope) -> bool:
        """Whether this worker holds a slot of ``scope`` (one it keeps)."""
        with self._lock:
            return any(s.scope == scope for slots in self._busy.values() for s in slots) or any(
                s.row_id not in self._going for s in self._idle.get(scope, ()))

    def holds_own(self, ref: Ref) -> bool:
        """Whether the delivery ``ref`` holds a slot of a scope's own limit (and so runs
        on the worker's threads for limited handlers)."""
        with self._lock:
            return any(not s.scope[1] for s in self._busy.get(ref, ()))

    def openings(self, scope: Scope) -> int:
        """Messages of ``scope`` the cycle may deliver to wait for a slot held here."""
        with self._lock:
            held = sum(1 for slots in self._busy.values() for s in slots if s.scope == scope)
            held += sum(1 for s in self._idle.get(scope, ()) if s.row_id not in self._going)
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

    def returnable(self) -> list[Slot]:
        """The idle slots, for the cycle to give back (see returned())."""
        with self._lock:
            slots = [s for held in self._idle.values() for s in held]
            self._going = {s.row_id for s in slots}
            return slots

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
            self._going.clear()

    def clear(self) -> None:
        with self._lock:
            self._busy.clear()
            self._idle.clear()
            self._waiting.clear()
            self._expected.clear()

    # ------------------------------------------------------------------ the handlers

    def defer(self, ref: Ref, start: Start) -> bool:
        """Whether the delivery ``ref`` waits for a slot (``start`` runs it when one
        frees); False: start it now (it holds its slots, or needs none)."""
        with self._lock:
            scope = self._expected.pop(ref, None)
            if scope is None:
                return False
            idle = self._idle.get(scope)
            if idle:
                slot = idle.pop()
                self._going.discard(slot.row_id)
                self._busy[ref] = [slot]
                return False
            self._waiting[scope].append((ref, start))
            return True

    def finished(self, ref: Ref) -> tuple[list[Start], bool]:
        """``ref``'s handler finished (or never started): pass each of its slots to the
        oldest message waiting for its scope, or leave it idle. Returns what to start, and
        whether every slot went on to a message with another still waiting behind it (so
        no poll cycle is needed yet to keep the slots busy)."""
        starts = []
        supplied = True
        with self._lock:
            slots = self._busy.pop(ref, ())
            for slot in slots:
                queue = self._waiting.get(slot.scope)
                if queue:
                    waiting, start = queue.popleft()
                    if not queue:
                        del self._waiting[slot.scope]
                        supplied = False
                    self._busy[waiting] = [slot]
                    starts.append(start)
                else:
                    self._idle[slot.scope].append(slot)
                    supplied = False
        return starts, bool(slots) and supplied
