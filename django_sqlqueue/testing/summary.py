"""What one ``drain()`` did: per topic, the messages handled, retried and dead-lettered."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class TopicCounts:
    """One topic's share of a drain, over all its consumer groups."""

    delivered: int = 0  # handler runs
    handled: int = 0  # acked: the handler returned
    retried: int = 0  # failed (or raised Retry) with attempts left
    dead_lettered: int = 0  # out of attempts, or the handler raised DeadLetter


@dataclass(frozen=True)
class Failure:
    """One failed handler run, as a worker would log it."""

    topic: str
    group: str
    key: str
    offset: int
    attempt: int
    error: str  # "ExceptionClass: message"
    dead_lettered: bool


@dataclass
class DrainResult:
    """What a drain ran: totals, ``by_topic``, each failure, and when the earliest
    message left waiting (a retry backing off, a delayed message) comes due."""

    by_topic: dict[str, TopicCounts] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    cycles: int = 0  # poll cycles run
    next_due: datetime | None = None  # None: nothing left waiting

    @property
    def delivered(self) -> int:
        return sum(c.delivered for c in self.by_topic.values())

    @property
    def handled(self) -> int:
        return sum(c.handled for c in self.by_topic.values())

    @property
    def retried(self) -> int:
        return sum(c.retried for c in self.by_topic.values())

    @property
    def dead_lettered(self) -> int:
        return sum(c.dead_lettered for c in self.by_topic.values())

    def topic(self, name: str) -> TopicCounts:
        """The counts of topic ``name`` (zeros when the drain ran none of it)."""
        return self.by_topic.get(name, TopicCounts())

    def counts(self, name: str) -> TopicCounts:
        return self.by_topic.setdefault(name, TopicCounts())

    def merge(self, other: DrainResult) -> None:
        """Add ``other``'s counts (a drain of topics on another alias) to these."""
        for name, counts in other.by_topic.items():
            mine = self.counts(name)
            mine.delivered += counts.delivered
            mine.handled += counts.handled
            mine.retried += counts.retried
            mine.dead_lettered += counts.dead_lettered
        self.failures += other.failures
        self.cycles += other.cycles
        if other.next_due is not None and (self.next_due is None
                                           or other.next_due < self.next_due):
            self.next_due = other.next_due

    def __str__(self) -> str:
        waiting = "" if self.next_due is None else f", next due {self.next_due.isoformat()}"
        return (f"drained {self.delivered} delivery(ies): {self.handled} handled, "
                f"{self.retried} retried, {self.dead_lettered} dead-lettered{waiting}")
