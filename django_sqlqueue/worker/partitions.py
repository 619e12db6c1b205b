"""What a worker knows about each partition it holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..consuming.message import Message
    from ..consuming.registry import Subscription


@dataclass
class InFlight:
    """A delivered message whose handler has not reported yet."""

    offset: int
    position: int
    invisible_until: int  # epoch ms, database clock


@dataclass
class Partition:
    """One leased (consumer group, topic, partition key)."""

    subscription: Subscription
    key: str
    generation: int
    watermark: int
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    # Stop fetching, release once in-flight work is done (rebalancing or shutdown).
    draining: bool = False
    # Re-read this partition in the next cycle (new messages, an ack, a due timer, ...).
    needs_look: bool = True
    # The last look found nothing above the watermark: only new messages can change that.
    settled: bool = False
    # The earliest known time (epoch ms) something in this partition becomes due.
    timer_ms: int | None = None
    # Acks were recorded since the last watermark walk (or the partition is new to us).
    dirty: bool = True
    # The highest position this worker handed out here; acked messages lie at or below it,
    # so the walk need not read further. None: unknown (just acquired), walk unbounded.
    max_position: int | None = None

    @property
    def group(self) -> str:
        return self.subscription.group

    @property
    def topic(self) -> str:
        return self.subscription.topic

    @property
    def ident(self) -> Ident:
        return (self.subscription.group, self.subscription.topic, self.key)

    def capacity(self) -> int:
        """How many more messages this partition may have in flight."""
        if self.draining:
            return 0
        if self.subscription.strict:
            return 0 if self.in_flight else 1
        return max(0, self.subscription.batch_size - len(self.in_flight))

    def add_timer(self, due_ms: int) -> None:
        self.timer_ms = due_ms if self.timer_ms is None else min(self.timer_ms, due_ms)


# (consumer group, topic, partition key): a partition as one consumer group sees it.
Ident = tuple[str, str, str]

OutcomeKind = Literal["ack", "nack", "dead"]


@dataclass
class Outcome:
    """What a handler's run decided for one delivery."""

    partition: Partition
    generation: int
    message: Message
    kind: OutcomeKind
    delay: float = 0.0  # seconds, for nack
    error: str = ""
