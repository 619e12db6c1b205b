"""The messages one poll cycle hands out, written together at the end of its reads.

Each message goes out once per cycle. Its delivery row (and with it its visibility
timeout) is written after every read of the cycle, from the clock read last, so slow
reads never eat into a handler's time. A message whose attempts ran out without an
outcome is dead-lettered instead of handed out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

from ..consuming.message import DeadLetterInfo, Message
from ..models import DeliveryState, QueueMessage
from ..models.delivery import Hold
from ..models.messages import MessageRow
from . import hooks, poison
from .limits import Candidate, LimitGate
from .partitions import Ident, Partition
from .recording import dead_letter
from .results import CycleResult, DeadOnFetch, Delivery
from .window import Entry

Subscriber = tuple[str, str]  # (consumer group, topic)


class HandOut:
    """One cycle's hand-outs and holds, batched per subscription."""

    def __init__(self, result: CycleResult, clock: Callable[[], int], using: str,
                 dlq_suffix: str, gate: LimitGate | None = None,
                 only: Mapping[Ident, frozenset[int]] | None = None) -> None:
        self.result = result
        self.gate = gate  # fleet-wide limits; None: none apply
        # A narrowed cycle: the only messages of these partitions that may go out.
        self.only = only
        self.clock = clock  # epoch ms by the database clock
        self.using = using
        self.dlq_suffix = dlq_suffix
        self.handed_out: dict[Subscriber, list[tuple[Partition, Entry]]] = defaultdict(list)
        # Rows keeping read messages invisible until due (a new owner finds them).
        self.holds: dict[Subscriber, list[Hold]] = defaultdict(list)
        # (partition, offset) of every message handed out this cycle: each goes out once.
        self.out: set[tuple[Ident, int]] = set()
        self.messages: dict[tuple[Ident, int], Message] = {}  # what goes out, for the limits

    def message(self, partition: Partition, entry: Entry, row: MessageRow,
                attempt: int) -> Message | None:
        """The Message to hand out for ``entry``, or None: held back (a narrowed cycle),
        or dead-lettered because its payload or headers cannot be decoded."""
        if self.only is not None:
            allowed = self.only.get(partition.ident)
            if allowed is not None and entry.offset not in allowed:
                self._hold_back(partition, entry)
                return None
        try:
            return Message.from_row(row, partition.group, attempt, partition.number)
        except Exception as exc:  # noqa: BLE001 - bytes the worker cannot read end as a dead letter
            error = f"{type(exc).__name__}: {exc}"
            poison.dead_letter_row(partition, row, entry, error, self.result, self.dlq_suffix,
                                   self.using)
            return None

    def _hold_back(self, partition: Partition, entry: Entry) -> None:
        """Leave ``entry`` due, not delivered, as a limit holds a message back: with a row
        keeping it for a new owner when it had none."""
        partition.hold_until(entry, entry.due_ms)
        if entry.attempts == 0:
            self.hold(partition, Hold(partition.number, entry.offset, entry.due_ms))

    def give(self, partition: Partition, entry: Entry, message: Message) -> None:
        """Deliver ``entry``; its visibility is set in write(), from the clock read after
        every fetch of the cycle, so slow reads never eat into a handler's time."""
        if (partition.ident, entry.offset) in self.out:
            return  # already going out in this cycle: one handler per delivery
        self.out.add((partition.ident, entry.offset))
        self.messages[(partition.ident, entry.offset)] = message
        self.handed_out[(partition.group, partition.topic)].append((partition, entry))
        self.result.report(partition).deliveries.append(
            Delivery(partition, partition.generation, message))

    def hold(self, partition: Partition, hold: Hold) -> None:
        self.holds[(partition.group, partition.topic)].append(hold)

    def expire(self, partition: Partition, entry: Entry, message: Message) -> None:
        """Dead-letter a message whose attempts ran out without an outcome (its workers
        kept dying, or kept losing it to the visibility timeout)."""
        subscription = partition.subscription
        error = entry.last_error or (
            f"visibility timeout expired {subscription.max_attempts} time(s) "
            "without an ack or nack"
        )
        message.attempt = entry.attempts  # the last attempt that actually ran
        dead_letter(partition, message, error, self.dlq_suffix, self.using)
        partition.settled(entry)
        self.result.report(partition).dead_on_fetch.append(DeadOnFetch(partition, message, error))

    def give_or_expire(self, partition: Partition, entry: Entry, message: Message) -> None:
        """Hand out a message delivered before, unless its attempts ran out."""
        if entry.attempts >= partition.subscription.max_attempts:
            self.expire(partition, entry, message)
        else:
            self.give(partition, entry, message)

    def write(self) -> None:
        """Write the holds and delivery rows, then tell the subscriptions' hooks and the
        handlers of dead-letter topics what goes out."""
        self._limit()
        for (group, topic), holds in self.holds.items():
            DeliveryState.objects.hold(group, topic, holds, self.using)
        now_ms = self.clock()
        for (group, topic), items in self.handed_out.items():
            until = now_ms + int(items[0][0].subscription.visibility_timeout * 1000)
            DeliveryState.objects.mark_delivered(
                group, topic, [p.ref(e.offset) for p, e in items], until, self.using)
            for partition, entry in items:
                partition.delivered(entry, until)
        hooks.call(self.result.reports.values(),
                   lambda report: [d.message for d in report.deliveries],
                   lambda hooks_, messages: hooks_.handed_out(messages, self.using))
        self._describe_dead_letters()

    def _limit(self) -> None:
        """Hold back what is over a fleet-wide limit (see :mod:`.limits`): not delivered,
        with a row keeping it for a new owner when it had none."""
        if self.gate is None:
            return
        candidates = [Candidate(partition, entry, self.messages[(partition.ident, entry.offset)])
                      for items in self.handed_out.values() for partition, entry in items
                      if partition.subscription.limits is not None]
        if not candidates:
            return
        held = self.gate.admit(candidates, self.clock())
        if not held:
            return
        out = {(c.partition.ident, c.entry.offset) for c in held}
        for key, items in list(self.handed_out.items()):
            kept = [(p, e) for p, e in items if (p.ident, e.offset) not in out]
            if kept:
                self.handed_out[key] = kept
            else:
                del self.handed_out[key]  # write() reads each list's first item
        for report in self.result.reports.values():
            report.deliveries = [d for d in report.deliveries
                                 if (d.partition.ident, d.message.offset) not in out]
        for candidate in held:
            self.out.discard((candidate.partition.ident, candidate.entry.offset))
            if candidate.entry.attempts == 0:
                self.hold(candidate.partition, Hold(candidate.partition.number,
                                                    candidate.entry.offset,
                                                    candidate.entry.due_ms))

    def _describe_dead_letters(self) -> None:
        """Tell handlers of a dead-letter topic which group gave up on each message, where
        it came from and why."""
        copies = [d.message for d in self.result.deliveries
                  if d.partition.topic.endswith(self.dlq_suffix)]
        if not copies:
            return
        details = QueueMessage.objects.dead_letter_details([m.offset for m in copies], self.using)
        for message in copies:
            found = details.get(message.offset)
            if found is not None and found[0]:  # a copy made by a worker, not a plain publish
                message.dead_letter = DeadLetterInfo(*found)
