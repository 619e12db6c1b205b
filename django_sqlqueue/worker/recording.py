"""Recording handlers' outcomes in the poll cycle's transaction: acks, retries, dead letters.

Acks are batched into one statement per consumer group and topic, written after the
watermarks moved: an acked message the watermark passed in the same cycle only has its
row deleted (strict partitions' acks go first, since the cycle reads them). Retries,
dead letters and undone deliveries are written at once, one statement per kind and
subscription, in a savepoint; should the database refuse that statement, each is written
in a savepoint of its own, so one the database refuses is kept back without failing the
cycle for every other partition.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction

from ..consuming.message import Message
from ..db.errors import is_transient
from ..logtext import loggable
from ..models import DeliveryState, QueueMessage
from ..models.delivery import MessageRef
from ..models.messages import DeadLetterSource, Failure
from . import hooks
from .outcomes import Outcome
from .partitions import Ident, Partition
from .results import CycleResult
from .window import Entry

logger = logging.getLogger("django_sqlqueue.worker")

# Cycles in which recording one outcome may fail before it is dropped (and its message
# redelivered once its visibility runs out).
OUTCOME_ATTEMPTS = 3


def record(partitions: dict[Ident, Partition], outcomes: list[Outcome], lost: set[Ident],
           sitting_out: set[Ident], now_ms: int, result: CycleResult, using: str,
           dlq_suffix: str) -> Ledger:
    """Record the ``outcomes`` of held partitions; mark in ``result`` which are done.
    Returns the ledger holding the acks, which the caller writes with
    :meth:`Ledger.flush` once it knows which the watermarks passed."""
    ledger = Ledger(now_ms, using, dlq_suffix)
    recordable: list[tuple[Outcome, Entry, Partition]] = []
    for outcome in outcomes:
        partition = outcome.partition
        if partition.ident in sitting_out and partitions.get(partition.ident) is partition:
            continue  # recorded once its lease row can be fenced again
        if (partitions.get(partition.ident) is not partition or partition.ident in lost
                or outcome.generation != partition.generation):
            result.done.append(outcome)
            continue  # the partition was lost: its new owner decides
        entry = partition.entry_for(outcome.message)
        if entry is None:
            result.done.append(outcome)
            continue  # already acked (a duplicate run finished first)
        if outcome.message.attempt < entry.attempts and not outcome.stands_when_superseded:
            result.done.append(outcome)
            continue  # a newer delivery of it is running; that one decides
        recordable.append((outcome, entry, partition))
    batched = write_batches(recordable, ledger, using)
    for outcome, entry, partition in recordable:
        if id(outcome) not in batched and partition.entry_for(outcome.message) is not entry:
            result.done.append(outcome)
            continue  # another outcome of the same message settled it just now
        if id(outcome) in batched or record_one(outcome, ledger, entry, partition, using):
            result.done.append(outcome)
            result.report(partition).recorded.append(outcome)
        elif outcome.failures >= OUTCOME_ATTEMPTS:
            result.done.append(outcome)
            logger.error(
                "giving up recording a handler outcome after %s failures; the message "
                "will be redelivered when its visibility runs out group=%s topic=%s "
                "partition=%s offset=%s", outcome.failures, partition.group,
                partition.topic, partition.number, entry.offset,
            )
    ledger.flush_strict()
    hooks.call(result.reports.values(), lambda report: report.recorded,
               lambda hooks_, recorded: hooks_.recorded(recorded, using))
    return ledger


def write_batches(recordable: list[tuple[Outcome, Entry, Partition]], ledger: Ledger,
                  using: str) -> set[int]:
    """Write the outcomes that batch (retries, undone deliveries) in one statement per
    kind and subscription, each statement in a savepoint; return the ids of the outcomes
    written. A statement the database refuses leaves its outcomes to :func:`record_one`,
    one savepoint each, which keeps back only the one it cannot write."""
    batches: dict[tuple[str, str, str], list[tuple[Outcome, Entry, Partition]]] = defaultdict(list)
    for item in recordable:
        outcome, _, partition = item
        if outcome.batch and outcome.writes_now:
            batches[(outcome.batch, partition.group, partition.topic)].append(item)
    written: set[int] = set()
    for (kind, group, topic), items in batches.items():
        if len(items) < 2:
            continue  # one alone costs the same either way
        try:
            with transaction.atomic(using=using):
                if kind == "nack":
                    DeliveryState.objects.nack_many(group, topic, [
                        (p.ref(e.offset), o.due_ms(ledger.now_ms), o.error)  # type: ignore[attr-defined]
                        for o, e, p in items], using)
                elif kind == "dead_letter":
                    dead_letter_many(group, topic, [(o.message, o.error) for o, _, _ in items],
                                     [p.ref(e.offset) for _, e, p in items], ledger.dlq_suffix,
                                     using)
                else:
                    DeliveryState.objects.undeliver_many(
                        group, topic, [p.ref(e.offset) for _, e, p in items], ledger.now_ms,
                        using)
        except Exception as exc:
            if is_transient(exc):
                raise  # contention or a lost connection: the whole cycle is retried
            continue
        for outcome, entry, _ in items:
            outcome.written(ledger, entry)
            written.add(id(outcome))
    return written


def record_one(outcome: Outcome, ledger: Ledger, entry: Entry, partition: Partition,
               using: str) -> bool:
    """Record one outcome in a savepoint of its own: an outcome the database refuses
    (a bug, or a value no check foresaw) is kept back, not allowed to fail the whole
    cycle and with it every other partition's progress. Returns whether it stuck."""
    if not outcome.writes_now:
        outcome.record(ledger, entry, partition.ref(entry.offset))
        return True
    try:
        with transaction.atomic(using=using):
            outcome.record(ledger, entry, partition.ref(entry.offset))
    except Exception as exc:
        if is_transient(exc):
            raise  # contention or a lost connection: the whole cycle is retried
        outcome.failures += 1
        logger.warning(
            "could not record a handler outcome (try %s of %s) group=%s topic=%s "
            "partition=%s offset=%s error=%s: %s", outcome.failures, OUTCOME_ATTEMPTS,
            partition.group, partition.topic, partition.number, entry.offset,
            type(exc).__name__, loggable(" ".join(str(exc).split()), 300),
        )
        return False
    return True


def dead_letter(partition: Partition, message: Message, error: str, dlq_suffix: str,
                using: str) -> None:
    """Copy to the group's dead-letter topic and ack for this group only; the original
    stays in the log for every other group."""
    QueueMessage.objects.copy_to_dead_letters(
        _dead_letter_source(message), partition.topic + dlq_suffix, partition.group,
        message.attempt, error, using,
    )
    DeliveryState.objects.ack(partition.group, partition.topic,
                              [partition.ref(message.offset)], using,
                              error=error or "dead-lettered")


def dead_letter_many(group: str, topic: str, failed: list[tuple[Message, str]],
                     refs: list[MessageRef], dlq_suffix: str, using: str) -> None:
    """:func:`dead_letter` for several messages of one subscription: one statement copies
    them, one acks them."""
    QueueMessage.objects.copy_many_to_dead_letters(
        [Failure(_dead_letter_source(message), message.attempt, error)
         for message, error in failed], topic + dlq_suffix, group, using)
    DeliveryState.objects.ack_failed(group, topic, [
        (ref, error) for ref, (_, error) in zip(refs, failed, strict=True)], using)


class Ledger:
    """How a poll cycle records outcomes: acks batched into one statement per consumer
    group and topic; retries and dead letters alone (several of a subscription in a cycle
    are written by :func:`write_batches`)."""

    def __init__(self, now_ms: int, using: str, dlq_suffix: str) -> None:
        self.now_ms = now_ms
        self.using = using
        self.dlq_suffix = dlq_suffix
        self.acks: dict[tuple[str, str], list[MessageRef]] = defaultdict(list)
        # Acks of strict partitions: written before the cycle goes on, since the cycle
        # reads which of a key's messages are done from the rows (settle_parked).
        self.strict_acks: dict[tuple[str, str], list[MessageRef]] = defaultdict(list)

    def ack(self, partition: Partition, ref: MessageRef) -> None:
        acks = self.strict_acks if partition.strict else self.acks
        acks[(partition.group, partition.topic)].append(ref)

    def flush_strict(self) -> None:
        for (group, topic), refs in self.strict_acks.items():
            DeliveryState.objects.ack(group, topic, refs, self.using)
        self.strict_acks.clear()

    def nack(self, partition: Partition, ref: MessageRef, due_ms: int, error: str) -> None:
        DeliveryState.objects.nack(partition.group, partition.topic, ref, due_ms, error,
                                   self.using)

    def dead_letter(self, partition: Partition, message: Message, error: str) -> None:
        dead_letter(partition, message, error, self.dlq_suffix, self.using)

    def undeliver(self, partition: Partition, ref: MessageRef) -> None:
        DeliveryState.objects.undeliver(partition.group, partition.topic, ref, self.now_ms,
                                        self.using)

    def flush(self, deleted: Mapping[tuple[str, str], set[MessageRef]] | None = None) -> None:
        """Write the acks, but for the rows in ``deleted``: the watermark passed those in
        this cycle and their rows are gone, so marking them acked first would only cost a
        write of every row the cycle finished."""
        for (group, topic), refs in self.acks.items():
            gone = (deleted or {}).get((group, topic))
            if gone:
                refs = [ref for ref in refs if ref not in gone]
            DeliveryState.objects.ack(group, topic, refs, self.using)

    def acked_refs(self, group: str, topic: str) -> list[MessageRef]:
        return self.acks.get((group, topic), [])


def _dead_letter_source(message: Message) -> DeadLetterSource:
    return DeadLetterSource(
        message.offset, message.topic, message.key, message.id,
        json.dumps(message.payload, cls=DjangoJSONEncoder, separators=(",", ":")),
        json.dumps(message.headers, separators=(",", ":")),
        round(message.published_at.timestamp() * 1000),
    )
