"""Replay and discard dead letters, selected by id or by filter, in bounded batches.

**Replay** appends a copy of each dead letter to its original topic, reserved for the
group that dead-lettered it (see :mod:`django_sqlqueue.replays`), and deletes the dead
letter in the same transaction. It is built from the dead-letter row, so it works after
GC has deleted the original. The replay goes to the *end* of its partition: it gets a new
position after every message published before the replay, and its key's earlier messages
do not wait for it. Every other group of the topic passes over it without running a
handler.

**Discard** deletes dead letters for good.

Both work batch by batch (``batch_size`` rows per transaction), paging through the
selection in index order, so a selection of 100,000 holds no lock for long and needs no
more memory than a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from django.db import transaction

from ..conf import get_settings, queue_database
from ..db import notify
from ..models import ConsumerOffset, DeliveryState, QueueMessage, Topic
from ..models.delivery import MessageRef
from ..signals import dead_letters_replayed
from ..store import dead_letters as rows
from ..store.connection import django_connection
from .errors import InvalidFilter
from .names import check_name, database_now_ms

BATCH_SIZE = 200  # dead letters per transaction: each holds its rows' locks well under a second
SAMPLE_SIZE = 10  # rows a dry run shows

Progress = Callable[[int, int], None]  # (done so far, total)


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters: every given condition must hold; none given selects all.

    ``ids`` are dead-letter ids (their offsets in ``queue_messages``, as the admin shows
    them); ``topic`` the topic the message was *published* to; ``group`` the consumer group
    that gave up on it; ``older_than`` seconds since it was dead-lettered;
    ``error_contains`` a case-insensitive substring of its last error.
    """

    ids: tuple[int, ...] = ()
    topic: str | None = None
    group: str | None = None
    older_than: float | None = None
    error_contains: str | None = None

    def validate(self) -> None:
        """Raise InvalidFilter naming the first bad value."""
        for value in self.ids:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidFilter(f"dead-letter ids are positive whole numbers, got {value!r}")
        if self.topic is not None:
            check_name("topic", self.topic)
        if self.group is not None:
            check_name("consumer group", self.group)
        if self.older_than is not None and (
                isinstance(self.older_than, bool) or not isinstance(self.older_than, int | float)
                or not 0 <= self.older_than < 10 * 365 * 86400):
            raise InvalidFilter(f"older_than must be seconds >= 0, got {self.older_than!r}")
        if self.error_contains is not None and not self.error_contains:
            raise InvalidFilter("error_contains must not be empty")


@dataclass(frozen=True)
class DeadLetterSample:
    id: int
    topic: str  # the original topic
    group: str
    key: str
    original_id: str
    attempts: int
    error: str  # first line of the last error
    failed_at_ms: int


@dataclass
class Outcome:
    """What replay() or discard() did (or, with dry_run, would do)."""

    matched: int = 0
    replayed: int = 0
    discarded: int = 0
    # Dead letters left in place: their group is no longer registered for the topic (a
    # replay would reach nobody and be collected unread).
    skipped: int = 0
    dry_run: bool = False
    sample: list[DeadLetterSample] = field(default_factory=list)


def _selection(flt: DeadLetterFilter, using: str) -> rows.Selection:
    flt.validate()
    suffix = get_settings().dlq_suffix
    if flt.topic is not None:
        topics = [flt.topic + suffix]
    else:
        # Dead-letter topics are sequenced like any other (so they are recorded), and
        # named after a topic some group consumes.
        known = set(Topic.objects.using(using).filter(topic__endswith=suffix)
                    .values_list("topic", flat=True))
        known |= {t + suffix for t in ConsumerOffset.objects.using(using)
                  .values_list("topic", flat=True).distinct()}
        topics = sorted(known)
    failed_before = None
    if flt.older_than is not None:
        failed_before = database_now_ms(using) - int(flt.older_than * 1000)
    return rows.Selection(tuple(topics), tuple(flt.ids), flt.group, failed_before,
                          flt.error_contains)


def count(flt: DeadLetterFilter, *, using: str | None = None) -> int:
    """How many dead letters the filter selects."""
    using = using or queue_database(flt.topic)
    return rows.count(django_connection(using), _selection(flt, using))


def sample(flt: DeadLetterFilter, *, limit: int = SAMPLE_SIZE,
           using: str | None = None) -> list[DeadLetterSample]:
    """The first ``limit`` selected dead letters (what a dry run shows)."""
    using = using or queue_database(flt.topic)
    refs = rows.page(django_connection(using), _selection(flt, using), None, limit)
    found = {m.offset: m for m in QueueMessage.objects.using(using).filter(
        offset__in=[r.offset for r in refs]).only(
        "offset", "original_topic", "consumer_group", "message_key", "original_id",
        "failure_count", "last_error", "failed_at")}
    return [DeadLetterSample(m.offset, m.original_topic, m.consumer_group, m.message_key,
                             m.original_id, m.failure_count,
                             (m.last_error.splitlines() or [""])[0], m.failed_at)
            for r in refs if (m := found.get(r.offset)) is not None]


class Replayed(NamedTuple):
    """One replayed dead letter, as ``signals.dead_letters_replayed`` reports it."""

    group: str  # the only group the replay goes to
    topic: str  # the topic it was published to, where the replay now sits
    original_id: str  # the id it was published with (``Message.id`` of the replay)


def replay(flt: DeadLetterFilter, *, dry_run: bool = False, batch_size: int = BATCH_SIZE,
           progress: Progress | None = None, using: str | None = None) -> Outcome:
    """Re-deliver the selected dead letters to the group that dead-lettered each, and only
    to it; see the module docstring for where a replay sits in its partition."""
    using = using or queue_database(flt.topic)
    return _run(flt, replay=True, dry_run=dry_run, batch_size=batch_size, progress=progress,
                using=using)


def discard(flt: DeadLetterFilter, *, dry_run: bool = False, batch_size: int = BATCH_SIZE,
            progress: Progress | None = None, using: str | None = None) -> Outcome:
    """Delete the selected dead letters for good."""
    using = using or queue_database(flt.topic)
    return _run(flt, replay=False, dry_run=dry_run, batch_size=batch_size, progress=progress,
                using=using)


def _run(flt: DeadLetterFilter, *, replay: bool, dry_run: bool, batch_size: int,
         progress: Progress | None, using: str) -> Outcome:
    if not 1 <= batch_size <= 10_000:
        raise InvalidFilter(f"batch_size must be from 1 to 10000, got {batch_size!r}")
    selection = _selection(flt, using)
    total = rows.count(django_connection(using), selection)
    outcome = Outcome(matched=total, dry_run=dry_run)
    if dry_run:
        outcome.sample = sample(flt, using=using)
        return outcome
    registered: dict[str, dict[str, int]] = {}
    after: tuple[str, str, int] | None = None
    done = 0
    while True:
        batch = rows.page(django_connection(using), selection, after, batch_size)
        if not batch:
            break
        after = (batch[-1].topic, batch[-1].partition, batch[-1].offset)
        topics = sorted(({r.original_topic for r in batch} | {r.topic for r in batch})
                        - set(registered))
        registered.update(ConsumerOffset.objects.registered_groups(topics, using))
        act = batch
        if replay:
            act = [r for r in batch if r.group in registered.get(r.original_topic, {})]
            outcome.skipped += len(batch) - len(act)
        with transaction.atomic(using=using):
            if replay:
                rows.insert_replays(django_connection(using), [r.offset for r in act])
                notify.announce({r.original_topic for r in act}, using)
                if act:
                    dead_letters_replayed.send(
                        sender=None, using=using,
                        replays=[Replayed(r.group, r.original_topic, r.original_id) for r in act])
            removed = _delete(act, registered, using)
        if replay:
            outcome.replayed += removed
        else:
            outcome.discarded += removed
        done += len(batch)
        if progress is not None:
            progress(min(done, total), total)
        if len(batch) < batch_size:
            break
    return outcome


def _delete(refs: list[rows.DeadLetterRef], registered: dict[str, dict[str, int]],
            using: str) -> int:
    """Delete dead-letter rows, and the delivery rows of groups consuming their
    dead-letter topic (a triage handler, say), which would otherwise be left behind."""
    if not refs:
        return 0
    by_topic: dict[str, list[MessageRef]] = {}
    for r in refs:
        by_topic.setdefault(r.topic, []).append(MessageRef(r.partition, r.offset))
    for topic, refs_of_topic in by_topic.items():
        for group in registered.get(topic, {}):
            DeliveryState.objects.delete_refs(group, topic, refs_of_topic, using)
    return QueueMessage.objects.delete_offsets([r.offset for r in refs], using)
