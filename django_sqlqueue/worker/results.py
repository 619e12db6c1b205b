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


def touched_by_failed_cycle(members: dict[Ident, Partition], outcomes: list[Outcome],
             result: CycleResult) -> set[int]:
    """Offsets of the messages a failed cycle of one partition handled before it failed:
    outcomes it was recording, and what it handed out, dead-lettered or extended."""
    if len(members) != 1:
        return set()
    [ident] = members
    touched = {o.message.offset for o in outcomes if o.partition.ident == ident}
    report = result.reports.get(ident)
    if report is not None:
        touched |= report.touched()
    return touched
