"""What a handler's run decided for one delivery, and what each decision does.

Each kind of outcome is one class here: how the poll cycle records it (in its transaction,
through a :class:`Ledger`) and which signal announces it once that transaction committed
(the worker sends it). A new kind is a new class in this module, raised by the dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..consuming.message import Message
from .partitions import Partition

if TYPE_CHECKING:
    from ..models.delivery import MessageRef
    from .window import Entry


class Ledger(Protocol):
    """The poll cycle's side of recording outcomes (see :mod:`.recording`)."""

    now_ms: int

    def ack(self, partition: Partition, ref: MessageRef) -> None: ...

    def nack(self, partition: Partition, ref: MessageRef, due_ms: int, error: str) -> None: ...

    def dead_letter(self, partition: Partition, message: Message, error: str) -> None: ...

    def undeliver(self, partition: Partition, ref: MessageRef) -> None: ...


@dataclass
class Outcome:
    partition: Partition
    generation: int  # of the lease the message was delivered under
    message: Message
    error: str = ""

    # Whether the outcome still counts when a newer delivery of the same message is running
    # (its visibility ran out and it was redelivered). Only a success does: the work is done.
    # Anything else is left to the newer delivery.
    stands_when_superseded: ClassVar[bool] = False
    # Whether recording it writes at once (in a savepoint of its own) rather than in a
    # batch written at the end of the cycle.
    writes_now: ClassVar[bool] = True
    # What it adds to the throughput counters once recorded: (handled, failed).
    counts: ClassVar[tuple[int, int]] = (0, 0)
    # The signal (a name in django_sqlqueue.signals) announcing it once recorded; '' for none.
    signal: ClassVar[str] = ""
    # The kind of statement several outcomes of a subscription are written with together
    # (see recording.write_batches), '' for none; ``written`` then does the rest.
    batch: ClassVar[str] = ""
    # Cycles whose attempt to record it failed (see recording.record_one).
    failures: int = field(default=0, compare=False, repr=False)

    def record(self, ledger: Ledger, entry: Entry, ref: MessageRef) -> None:
        raise NotImplementedError

    def written(self, ledger: Ledger, entry: Entry) -> None:
        """What recording does besides the write, once a batch wrote it."""
        raise NotImplementedError

    def signal_arguments(self) -> dict[str, Any]:
        """What its signal carries besides the message and the subscription."""
        return {}


@dataclass
class Acked(Outcome):
    """The handler returned: the message is done for this group."""

    stands_when_superseded: ClassVar[bool] = True
    writes_now: ClassVar[bool] = False  # acks are batched, one statement per subscription
    counts: ClassVar[tuple[int, int]] = (1, 0)
    signal: ClassVar[str] = "message_acked"

    def record(self, ledger: Ledger, entry: Entry, ref: MessageRef) -> None:
        ledger.ack(self.partition, ref)
        self.partition.settled(entry)


@dataclass
class Retried(Outcome):
    """The handler failed (or raised Retry) with attempts left: visible again after ``delay``."""

    delay: float = 0.0  # seconds
    counts: ClassVar[tuple[int, int]] = (0, 1)
    signal: ClassVar[str] = "message_nacked"

    batch: ClassVar[str] = "nack"

    def due_ms(self, now_ms: int) -> int:
        return now_ms + int(self.delay * 1000)

    def record(self, ledger: Ledger, entry: Entry, ref: MessageRef) -> None:
        ledger.nack(self.partition, ref, self.due_ms(ledger.now_ms), self.error)
        self.written(ledger, entry)

    def written(self, ledger: Ledger, entry: Entry) -> None:
        self.partition.retry_at(entry, self.due_ms(ledger.now_ms), self.error)

    def signal_arguments(self) -> dict[str, Any]:
        return {"delay": self.delay, "error": self.error}


@dataclass
class NotStarted(Outcome):
    """The handler was not started: when a thread came free the lease was in doubt (the
    worker could not renew it in time). If the partition is still this worker's, the
    delivery is undone and the message is deliverable again at once, rather than waiting
    in flight for a handler that does not exist until its visibility runs out."""

    # No signal: nothing happened to announce.

    batch: ClassVar[str] = "undeliver"

    def record(self, ledger: Ledger, entry: Entry, ref: MessageRef) -> None:
        ledger.undeliver(self.partition, ref)
        self.written(ledger, entry)

    def written(self, ledger: Ledger, entry: Entry) -> None:
        entry.attempts -= 1
        self.partition.retry_at(entry, ledger.now_ms, entry.last_error)


@dataclass
class DeadLettered(Outcome):
    """Out of attempts, or the handler raised DeadLetter: copied to the group's dead-letter
    topic and done for this group."""

    counts: ClassVar[tuple[int, int]] = (1, 1)
    signal: ClassVar[str] = "message_dead_lettered"

    batch: ClassVar[str] = "dead_letter"

    def record(self, ledger: Ledger, entry: Entry, ref: MessageRef) -> None:
        ledger.dead_letter(self.partition, self.message, self.error)
        self.written(ledger, entry)

    def written(self, ledger: Ledger, entry: Entry) -> None:
        self.partition.settled(entry)

    def signal_arguments(self) -> dict[str, Any]:
        return {"error": self.error}
