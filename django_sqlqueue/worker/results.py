"""What one poll cycle did, partition by partition: the worker applies it once committed."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..consuming.message import Message
from .outcomes import Outcome
from .partitions import Ident, Partition


@dataclass
class Delivery:
    partition: Partition
    generation: int
    message: Message


@dataclass
class DeadOnFetch:
    """A message whose attempts ran out without an outcome (its workers kept dying)."""

    partition: Partition
    message: Message
    error: str


@dataclass
class PartitionReport:
    """What one cycle did in one partition."""

    partition: Partition
    deliveries: list[Delivery] = field(default_factory=list)
    recorded: list[Outcome] = field(default_factory=list)
    dead_on_fetch: list[DeadOnFetch] = field(default_factory=list)
    extended: list[int] = field(default_factory=list)  # offsets whose visibility it extended
    more: bool = False  # it could hand out more at once

    def touched(self) -> set[int]:
        """Offsets of the messages this cycle handed out, dead-lettered or extended here
        (what a failed cycle is narrowed down over, see worker.isolation)."""
        return ({d.message.offset for d in self.deliveries}
                | {d.message.offset for d in self.dead_on_fetch} | set(self.extended))


@dataclass
class CycleResult:
    reports: dict[Ident, PartitionReport] = field(default_factory=dict)
    lost: list[Partition] = field(default_factory=list)
    # Outcomes no longer pending: recorded, ignored as stale, or for a lost partition.
    done: list[Outcome] = field(default_factory=list)

    def report(self, partition: Partition) -> PartitionReport:
        report = self.reports.get(partition.ident)
        if report is None:
            report = self.reports[partition.ident] = PartitionReport(partition)
        return report

    @property
    def deliveries(self) -> list[Delivery]:
        return [d for r in self.reports.values() for d in r.deliveries]

    @property
    def full(self) -> bool:
        return any(r.more for r in self.reports.values())
