"""Parking: a partition's waiting messages kept in the database instead of in memory.

A message that waits longer than PARK_AFTER_MS (delayed, or a retry backing off), or waits
while the window is crowded, is *parked* (see :mod:`django_sqlqueue.models.waiting`) and
read back when it comes due. The watermark does not wait for parked messages, so it is the
position below the lowest entry that was never parked.

These are :class:`~.partitions.Partition`'s transitions for its parked messages, kept
apart from its window's; the state they share is declared below for type checking.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ..models.delivery import ReadRow
from ..models.waiting import PARKED_BEHIND, PARKED_DUE, KeyHead, Park
from .window import NEVER_MS, PARK_AFTER_MS, Admitted, Entry, attempts_of, max_window

if TYPE_CHECKING:
    from ..models.messages import MessageRow


class Parking:
    """The parking half of a partition's state (mixed into ``Partition``)."""

    if TYPE_CHECKING:  # Partition's fields and steps that parking uses
        number: str
        entries: dict[int, Entry]
        key_queues: dict[str, deque[int]]
        _in_flight: set[int]
        _moved: bool
        _done_up_to: int
        parked_next: int | None
        _unparked: set[int]
        _parking: list[Park]
        _retried: list[Entry]
        _parked_keys: set[str]
        _key_checks: list[str]
        parked_keys_possible: bool | None

        @property
        def strict(self) -> bool: ...

        def _schedule(self, entry: Entry) -> None: ...

        def _priority_of(self, message: MessageRow) -> int: ...

    def parked_due(self, now_ms: int) -> bool:
        """A parked message may be due: look for it in the database."""
        return self.parked_next is None or self.parked_next <= now_ms

    def unparked_count(self) -> int:
        return len(self._unparked)

    def unpark(self, row: ReadRow) -> Entry | None:
        """Take a parked message that came due back into the window (it stays parked in
        the database until it is acked, so the watermark never waits for it)."""
        message, delivery = row.message, row.delivery
        if message.offset in self.entries or delivery is None:
            return None  # already here (in flight, or a retry waiting briefly)
        entry = Entry(message.offset, message.position or 0, message.key, attempts_of(delivery),
                      "waiting", delivery.invisible_until, delivery.last_error,
                      self._priority_of(message), parked=True)
        self.entries[entry.offset] = entry
        self._unparked.add(entry.offset)
        self._moved = True
        if self.strict and entry.key:
            # Its later messages are parked behind it, and new ones join them.
            self._parked_keys.add(entry.key)
            self.parked_keys_possible = True
            queue = self.key_queues.setdefault(entry.key, deque())
            # Normally empty: a key's parked messages follow the ones kept here.
            index = sum(1 for o in queue if self.entries[o].position < entry.position)
            queue.insert(index, entry.offset)
            if index > 0:
                entry.state = "blocked"
                return entry
            if len(queue) > 1 and self.entries[queue[1]].state == "waiting":
                self.entries[queue[1]].state = "blocked"
        self._schedule(entry)
        return entry

    def looked_for_parked(self, next_due: int | None) -> None:
        """The database was asked for due parked messages: ``next_due`` is when the next
        one not taken comes due (None: there is none)."""
        self.parked_next = NEVER_MS if next_due is None else next_due

    def park_retries(self, now_ms: int) -> None:
        """Park the retries recorded since the last call that back off for long."""
        retried, self._retried = self._retried, []
        for entry in retried:
            if (self.entries.get(entry.offset) is entry and entry.state == "waiting"
                    and entry.due_ms > now_ms + PARK_AFTER_MS):
                self._park_entries(entry)

    def take_parking(self) -> list[Park]:
        """The rows to park that this cycle decided on (the caller writes them)."""
        parking, self._parking = self._parking, []
        # Keys with no entries here any more: the database says whether they have parked
        # messages (so this set stays as small as the window).
        self._parked_keys.intersection_update(self.key_queues)
        return parking

    def take_key_checks(self) -> list[str]:
        """Keys whose entries here are all done and whose next parked message (if any)
        may go now."""
        checks, self._key_checks = self._key_checks, []
        return [key for key in dict.fromkeys(checks) if key not in self.key_queues]

    def keys_have_parked(self, keys: set[str]) -> None:
        """``keys`` have parked messages: their new messages are parked behind them."""
        self._parked_keys.update(keys)
        if keys:
            self.parked_keys_possible = True

    def key_head_found(self, key: str, head: KeyHead | None) -> None:
        """The first parked message of ``key`` (None: it has none), now PARKED_DUE."""
        if head is None:
            self._parked_keys.discard(key)
        elif self.parked_next is not None:
            self.parked_next = min(self.parked_next, head.until)

    def _waits_long(self, entry: Entry, now_ms: int, behind: bool) -> bool:
        """Whether a message just read should be parked rather than kept here: it will
        not be due for long, or it waits (for its time or its key) in a crowded window."""
        if entry.due_ms > now_ms + PARK_AFTER_MS:
            return True
        if not behind and entry.due_ms <= now_ms:
            return False  # deliverable now
        return len(self.entries) >= max_window() // 2

    def _park_new(self, entry: Entry, state: int) -> Admitted:
        self._park(entry, state)
        return Admitted(None)

    def _park_entries(self, entry: Entry) -> None:
        """Park ``entry`` and, in strict mode, every other entry of its key (all later:
        a key's messages kept here come before its parked ones)."""
        offsets = [entry.offset]
        if self.strict and entry.key:
            queue = self.key_queues.get(entry.key)
            if queue:
                if any(self.entries[o].state == "in_flight" for o in queue if o != entry.offset):
                    return  # one of them runs: its outcome needs its entry
                offsets = list(queue)
                del self.key_queues[entry.key]
        for index, offset in enumerate(offsets):
            parked = self.entries.pop(offset)
            self._in_flight.discard(offset)
            self._unparked.discard(offset)
            self._park(parked, PARKED_DUE if index == 0 else PARKED_BEHIND)
        self._moved = True

    def _park(self, entry: Entry, state: int) -> None:
        self._parking.append(Park(self.number, entry.offset, entry.key, entry.position,
                                  entry.due_ms, state))
        # A watermark move past it is saved at once (its row stays, and is read back).
        self._done_up_to = max(self._done_up_to, entry.position)
        if self.strict and entry.key:
            self._parked_keys.add(entry.key)
            self.parked_keys_possible = True
        if state == PARKED_DUE and self.parked_next is not None:
            self.parked_next = min(self.parked_next, entry.due_ms)

    def _forget_parked(self) -> None:
        self.parked_next = None
        self._unparked.clear()
        self._parking.clear()
        self._retried.clear()
        self._parked_keys.clear()
        self._key_checks.clear()
        self.parked_keys_possible = None

