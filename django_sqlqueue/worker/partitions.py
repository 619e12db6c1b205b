"""What a worker knows about each partition it holds, and the transitions of that state.

A partition's *window* (see :mod:`.window`) is the stretch of the log between the group's
watermark and the read cursor; the owner keeps each unacked message of it in memory as an
``Entry``, and everything else in it is acked. So the watermark is simply the position
below the lowest entry, and nothing acked is ever read again. Waiting messages need not
stay: they are parked in the database (see :mod:`.parking`).

Keys give the order: in strict mode (``batch_size=1``) a key's messages are handled one
at a time in log order, and a key waits only for its own head, never for other keys of
the partition. In concurrent mode messages are handed out in log order and may run at
the same time (the RFC's non-blocking nack). Keyless messages never wait for each other.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..models.delivery import MessageRef, ReadRow
from ..models.waiting import PARKED_BEHIND, PARKED_DUE, Park
from ..replays import replay_target
from ..rows import decode_json
from .parking import Parking
from .window import Admitted, Entry, attempts_of, max_window

if TYPE_CHECKING:
    from ..consuming.message import Message
    from ..consuming.registry import Subscription
    from ..models.messages import MessageRow

# (consumer group, topic, partition): a partition as one consumer group sees it.
Ident = tuple[str, str, str]


@dataclass
class Partition(Parking):
    """One leased (consumer group, topic, partition)."""

    subscription: Subscription
    number: str  # the partition_key column value
    generation: int
    watermark: int = 0
    cursor: int = 0
    # The window was rebuilt from the database since the lease was taken (or a failed
    # poll made it unreliable): until then nothing is delivered from it.
    loaded: bool = False
    # The highest position known to be in the partition; None: unknown, read to find out.
    head: int | None = None
    entries: dict[int, Entry] = field(default_factory=dict)
    # Strict mode: per key, the offsets of its unacked messages in log order, head first.
    key_queues: dict[str, deque[int]] = field(default_factory=dict)
    # Heap of (due_ms, offset, timer): an entry has at most one live item in it or in
    # _ready, so no entry is ever handed out twice at once however often it is scheduled.
    _timers: list[tuple[int, int, int]] = field(default_factory=list)
    # Offsets of the in-flight entries: polls ask about them every tick, so they are not
    # found by scanning a window that may hold thousands of waiting entries.
    _in_flight: set[int] = field(default_factory=set)
    # An entry was admitted or settled since the watermark was last moved.
    _moved: bool = False
    # The highest position settled, parked or read back acked (see advance).
    _done_up_to: int = 0
    # Offsets of the entries in position order (messages are admitted in position order);
    # settled ones are dropped lazily from the front. The watermark is found from the
    # front, not by scanning a window of up to MAX_WINDOW entries every cycle.
    _order: deque[int] = field(default_factory=deque)
    # Prioritised subscriptions (task queues) only: due entries by (-priority, position,
    # offset, timer), moved here from _timers as they come due. Stale items (delivered, settled
    # or rescheduled since) are skipped when they reach the top.
    _ready: list[tuple[int, int, int, int]] = field(default_factory=list)
    _last_timer: int = 0  # the sequence number of the newest timer
    # Parked messages (see models.waiting): when the earliest due one comes due (None:
    # unknown, look); entries read back from parked rows; what this cycle parks.
    parked_next: int | None = None
    _unparked: set[int] = field(default_factory=set)
    _parking: list[Park] = field(default_factory=list)
    _retried: list[Entry] = field(default_factory=list)
    # Strict mode: keys known to have parked messages while they also have entries here
    # (their new messages are parked behind them), keys whose entries here are all done
    # and whose next parked message must be looked for, and whether this partition may
    # have keyed parked messages at all (None: not known since the window was rebuilt).
    _parked_keys: set[str] = field(default_factory=set)
    _key_checks: list[str] = field(default_factory=list)
    parked_keys_possible: bool | None = None
    # The lease row's count of cancellations when the window was last built or checked:
    # a cancellation bumps it, and the window is rebuilt without the cancelled message.
    cancellations: int | None = None
    # Stop fetching, release once in-flight work is done (rebalancing or shutdown).
    draining: bool = False
    # The progress as last saved or read back (or a watermark worth it: see advance).
    saved_watermark: int = 0
    saved_cursor: int = 0
    # Until when (time.monotonic()) the lease is surely still this worker's: the start of
    # its last confirmed renewal (or take) plus the lease duration. Set by the leasing.
    valid_until: float = 0.0
    # Another worker took the partition over; handlers queued for it must not start.
    lost: bool = False
    # An operator paused the group on this topic: nothing new is handed out or read;
    # outcomes of running handlers are still recorded and the lease is kept.
    paused: bool = False

    @property
    def group(self) -> str:
        return self.subscription.group

    @property
    def topic(self) -> str:
        return self.subscription.topic

    @property
    def ident(self) -> Ident:
        return (self.subscription.group, self.subscription.topic, self.number)

    @property
    def strict(self) -> bool:
        return self.subscription.strict

    # ----------------------------------------------------------------- questions

    def usable(self, generation: int) -> bool:
        """Whether a handler for a message delivered under ``generation`` may start now
        (asked from handler threads; the fields read are single assignments)."""
        return (not self.lost and generation == self.generation
                and time.monotonic() < self.valid_until)

    def in_flight(self) -> list[Entry]:
        return [self.entries[offset] for offset in self._in_flight]

    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def due_for_extension(self, now_ms: int, may_extend: Callable[[Ident, int], bool]) -> list[Entry]:
        """Running messages that used half their visibility timeout (auto-extension);
        ``may_extend`` says whether a message's handler still runs and may be extended."""
        if not self.subscription.auto_extend:
            return []
        half = int(self.subscription.visibility_timeout * 500)
        return [e for e in self.in_flight()
                if e.due_ms - now_ms < half and may_extend(self.ident, e.offset)]

    def unread(self) -> bool:
        """Messages may wait above the read cursor."""
        return self.head is None or self.head > self.cursor

    def window_space(self) -> int:
        return 0 if self.draining else max_window() - len(self.entries)

    def next_due(self) -> int | None:
        """When the earliest waiting (or expiring in-flight) entry becomes deliverable."""
        timers = self._timers
        while timers:
            due, offset, timer = timers[0]
            if self._live(offset, timer):
                return due
            heapq.heappop(timers)  # stale: settled, rescheduled or blocked since
        return None

    def wants_look(self, now_ms: int) -> bool:
        if self.draining or self.paused:
            return False
        if not self.loaded:
            return True
        due = self.next_due()
        return ((due is not None and due <= now_ms) or self.best_ready(now_ms) is not None
                or (self.unread() and self.window_space() > 0) or self.parked_due(now_ms))

    # ----------------------------------------------------------------- transitions

    def reset(self, watermark: int, cursor: int,
              running: Callable[[int], bool] | None = None) -> None:
        """Forget the window, before it is rebuilt from the database. Entries read back
        from parked rows whose handler is ``running`` are kept: the rebuild, which reads
        the window's rows only, would not find them."""
        keep = [self.entries[offset] for offset in self._unparked
                if running is not None and self.entries[offset].state == "in_flight"
                and running(offset)]
        self._forget_parked()
        self.watermark, self.cursor = watermark, max(watermark, cursor)
        self.entries.clear()
        self._order.clear()
        self.key_queues.clear()
        self._timers.clear()
        self._in_flight.clear()
        self._ready.clear()
        self._moved = True  # (watermark, cursor] may be all acked: the next advance looks
        self._done_up_to = self.cursor
        self.head = None
        self.loaded = False
        self.saved_watermark, self.saved_cursor = self.watermark, self.cursor
        for entry in keep:
            self.entries[entry.offset] = entry
            self._unparked.add(entry.offset)
            self._run(entry)
            if self.strict and entry.key:
                self.key_queues[entry.key] = deque([entry.offset])

    def rebuilt(self) -> None:
        """The window now holds what the database had: the progress read is the saved one."""
        self.loaded = True

    def unreliable(self) -> None:
        """A cycle failed after changing this window: rebuild it before delivering again."""
        self.loaded = False

    def progress_due(self) -> bool:
        """Whether the watermark or the read cursor moved since they were saved (a rebuild
        reads the window's rows up to the saved cursor, so it is saved at once)."""
        return self.watermark != self.saved_watermark or self.cursor != self.saved_cursor

    def progress_written(self) -> None:
        self.saved_watermark, self.saved_cursor = self.watermark, self.cursor

    def admit(self, row: ReadRow, now_ms: int, may_deliver: bool) -> Admitted:
        """Take one message (in position order) into the window.

        ``may_deliver`` is False while rebuilding, or when there is no capacity left: the
        message then waits, with a row recording it so a new owner finds it.
        """
        message, delivery = row.message, row.delivery
        position = message.position or 0
        self.cursor = max(self.cursor, position)
        self._moved = True
        if delivery is not None and delivery.acked:
            self._done_up_to = max(self._done_up_to, position)
            return Admitted(None)
        target = replay_target(message.metadata)
        if target is not None and target != self.group:
            # A replayed dead letter of another group: passed over as if acked, never run.
            self._done_up_to = max(self._done_up_to, position)
            return Admitted(None)
        entry = Entry(
            message.offset, position, message.key, attempts_of(delivery), "waiting",
            message.deliver_at if delivery is None else delivery.invisible_until,
            "" if delivery is None else delivery.last_error, self._priority_of(message),
        )
        behind = False
        if self.strict and entry.key:
            if entry.key in self._parked_keys:
                return self._park_new(entry, PARKED_BEHIND)  # its key's head is parked
            behind = entry.key in self.key_queues
        if entry.attempts == 0 and self._waits_long(entry, now_ms, behind):
            return self._park_new(entry, PARKED_BEHIND if behind else PARKED_DUE)
        if entry.attempts > 0 and not (delivery is not None and delivery.in_flight):
            # Delivered before (a rebuilt window): it may be running here, which only the
            # caller knows; park_retries() parks it if it just waits out a backoff. One
            # whose handler has reported nothing stays: its outcome may be on its way here
            # (a window rebuilt after a cancellation, say), and must find it.
            self._retried.append(entry)
        self.entries[entry.offset] = entry
        self._order.append(entry.offset)
        needs_row = delivery is None
        if self.strict and entry.key:
            queue = self.key_queues.setdefault(entry.key, deque())
            queue.append(entry.offset)
            if len(queue) > 1:
                entry.state = "blocked"  # its key's head is not done yet
                return Admitted(entry, hold_until=entry.due_ms if needs_row else None)
        if may_deliver and entry.due_ms <= now_ms and entry.attempts == 0:
            return Admitted(entry, deliver=True)
        self._schedule(entry)
        return Admitted(entry, hold_until=entry.due_ms if needs_row else None)

    def take_ready(self, now_ms: int, limit: int) -> list[Entry]:
        """Up to ``limit`` entries due now (retries, delayed messages, keys whose head was
        settled, and in-flight messages whose visibility ran out), in due order."""
        ready: list[Entry] = []
        while len(ready) < limit:
            due = self.next_due()
            if due is None or due > now_ms:
                break
            _, offset, _ = heapq.heappop(self._timers)
            entry = self.entries[offset]
            entry.timer = 0  # handed out: its next schedule starts a new timer
            ready.append(entry)
        return ready

    def best_ready(self, now_ms: int) -> Entry | None:
        """Prioritised subscriptions: the highest-priority entry due now (the oldest of
        equal ones), left in place; None when none is due."""
        if self.subscription.priority_of is None:
            return None
        self._promote(now_ms)
        ready = self._ready
        while ready:
            _, _, offset, timer = ready[0]
            entry = self.entries.get(offset)
            if self._live(offset, timer) and entry is not None and entry.due_ms <= now_ms:
                return entry
            heapq.heappop(ready)  # stale
        return None

    def pop_best(self) -> None:
        """Remove the entry best_ready() returned, which the caller is delivering."""
        _, _, offset, _ = heapq.heappop(self._ready)
        self.entries[offset].timer = 0

    def _promote(self, now_ms: int) -> None:
        """Move entries that came due from the timers to the priority heap."""
        while True:
            due = self.next_due()
            if due is None or due > now_ms:
                return
            _, offset, timer = heapq.heappop(self._timers)
            entry = self.entries[offset]
            heapq.heappush(self._ready, (-entry.priority, entry.position, offset, timer))

    def _priority_of(self, message: MessageRow) -> int:
        priority_of = self.subscription.priority_of
        if priority_of is None:
            return 0
        try:
            return int(priority_of(decode_json(message.payload)))
        except Exception:  # noqa: BLE001 - a payload that names no usable priority runs at 0
            return 0

    def delivered(self, entry: Entry, invisible_until: int) -> None:
        entry.attempts += 1
        entry.due_ms = invisible_until
        self._run(entry)

    def running(self, entry: Entry) -> None:
        """A rebuilt entry whose handler still runs in this process: it stays in flight
        until its visibility runs out (then it is redelivered once), and is extended like
        any other."""
        self._run(entry)

    def extended(self, offset: int, invisible_until: int) -> None:
        entry = self.entries.get(offset)
        if entry is not None and entry.state == "in_flight" and invisible_until > entry.due_ms:
            entry.due_ms = invisible_until
            self._schedule(entry)

    def retry_at(self, entry: Entry, due_ms: int, error: str) -> None:
        self._in_flight.discard(entry.offset)
        entry.state = "waiting"
        entry.due_ms = due_ms
        entry.last_error = error
        self._schedule(entry)
        self._retried.append(entry)  # parked by park_retries() if it waits long

    def postpone(self, now_ms: int, until_ms: int) -> None:
        """Entries due by ``now_ms`` wait until ``until_ms``, as held back by a limit
        (see hold_until()): a limit lets none of them go before."""
        if self.subscription.priority_of is not None:
            while (entry := self.best_ready(now_ms)) is not None:
                self.pop_best()
                self.hold_until(entry, until_ms)
            return
        for entry in self.take_ready(now_ms, len(self.entries)):
            self.hold_until(entry, until_ms)

    def hold_until(self, entry: Entry, due_ms: int) -> None:
        """A fleet-wide limit holds ``entry`` back (see :mod:`.limits`): it waits, not
        delivered and its attempts unchanged, until ``due_ms``; it stays its key's head."""
        self._in_flight.discard(entry.offset)  # a redelivery of an expired one, say
        entry.state = "waiting"
        entry.due_ms = due_ms
        self._schedule(entry)

    def settled(self, entry: Entry) -> None:
        """The group is done with ``entry`` (acked or dead-lettered): drop it, and let the
        next message of its key go (strict mode)."""
        self.entries.pop(entry.offset, None)
        self._in_flight.discard(entry.offset)
        self._unparked.discard(entry.offset)
        self._moved = True
        self._done_up_to = max(self._done_up_to, entry.position)
        queue = self.key_queues.get(entry.key) if entry.key else None
        if queue is None:
            return
        if queue and queue[0] == entry.offset:
            queue.popleft()
        else:  # not the head (redelivered out of turn): remove it wherever it is
            with contextlib.suppress(ValueError):
                queue.remove(entry.offset)
        if not queue:
            del self.key_queues[entry.key]
            if self.parked_keys_possible is not False:
                self._key_checks.append(entry.key)  # its next message may be parked
            return
        successor = self.entries[queue[0]]
        if successor.state == "blocked":
            successor.state = "waiting"
            self._schedule(successor)

    def advance(self) -> tuple[int, int] | None:
        """Move the watermark up to just below the lowest unacked entry (or to the cursor);
        return (old, new) when it passed a message the group is done with (the caller
        drops such rows). Reading a partition's next message moves its watermark over
        other partitions' positions only: such a move is not returned, and a saved
        watermark at the old value is worth the new one (a rebuild reads the same rows)."""
        if not self._moved:
            return None
        self._moved = False
        lowest = self._lowest_position()
        new = self.cursor if lowest is None else lowest - 1
        if new <= self.watermark:
            return None
        old, self.watermark = self.watermark, new
        if self._done_up_to > old:
            return old, new
        if self.saved_watermark == old:
            self.saved_watermark = new
        return None

    def entry_for(self, message: Message) -> Entry | None:
        return self.entries.get(message.offset)

    def ref(self, offset: int) -> MessageRef:
        return MessageRef(self.number, offset)

    def _lowest_position(self) -> int | None:
        order = self._order
        while order and (order[0] not in self.entries or self.entries[order[0]].parked):
            order.popleft()
        if len(order) > 2 * len(self.entries) + 64:
            # Many settled behind an unsettled head: rebuild from the window (whose dict
            # keeps admission order), so the queue stays as small as the window.
            self._order = order = deque(o for o, e in self.entries.items() if not e.parked)
        return self.entries[order[0]].position if order else None

    def _run(self, entry: Entry) -> None:
        entry.state = "in_flight"
        self._in_flight.add(entry.offset)
        self._schedule(entry)

    def _schedule(self, entry: Entry) -> None:
        """(Re)schedule ``entry`` at its due time; any earlier timer of it goes stale."""
        self._last_timer += 1
        entry.timer = self._last_timer
        heapq.heappush(self._timers, (entry.due_ms, entry.offset, entry.timer))

    def _live(self, offset: int, timer: int) -> bool:
        """Whether a heap item is the entry's live timer (not settled, rescheduled or
        blocked since)."""
        entry = self.entries.get(offset)
        return entry is not None and entry.timer == timer and entry.state != "blocked"


def by_subscription(partitions: Iterable[Partition]) -> dict[tuple[str, str], list[Partition]]:
    """``partitions`` per (consumer group, topic): one statement serves each such group."""
    grouped: dict[tuple[str, str], list[Partition]] = defaultdict(list)
    for partition in partitions:
        grouped[(partition.group, partition.topic)].append(partition)
    return grouped
