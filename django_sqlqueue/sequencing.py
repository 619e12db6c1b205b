"""The sequencer: gives committed messages their consumable position and their partition.

Positions follow commit order across sequencing batches and offset (insert) order within
one batch; docs/data-model.md, "The order consumers see", states it exactly.

Any worker may run it; the counter row's lock (taken with SKIP LOCKED) makes one of them
do it at a time and lets the others carry on. See docs/data-model.md for why offsets
alone are not safe to consume by.

Partitions are assigned here rather than at publish time, under the same lock, from the
count recorded in ``queue_topics``. A change of a topic's count (see
:mod:`django_sqlqueue.repartition`) takes that lock too, so no message is ever mapped
with a count other than the one its topic had when it was positioned.
"""

from __future__ import annotations

from django.db import transaction

from .conf import get_settings
from .models import LogSequencer, QueueMessage, Topic
from .partitioning import assign_partition

SEQUENCE_BATCH = 1000  # rows per sequencing transaction: short row locks, short lag


def sequence_pending(using: str = "default", sequenced_by: str = "",
                     limit: int = SEQUENCE_BATCH) -> int:
    """Position up to ``limit`` committed, unsequenced messages; return how many.

    Returns 0 when another worker is sequencing right now or nothing is waiting.
    """
    return sequence_batch(using, sequenced_by, limit)[0]


def sequence_batch(using: str = "default", sequenced_by: str = "",
                   limit: int = SEQUENCE_BATCH) -> tuple[int, int | None]:
    """Like sequence_pending(), also returning the last position now assigned (the log
    head), or None when another worker holds the sequencer."""
    with transaction.atomic(using=using):
        last = LogSequencer.objects.lock_counter(using)
        if last is None:
            return 0, None
        rows = QueueMessage.objects.unsequenced(limit, using)
        if not rows:
            return 0, last
        counts = partition_counts({row.topic for row in rows}, using)
        QueueMessage.objects.assign_positions(
            [(row.offset, last + 1 + index, assign_partition(row.key, row.offset, counts[row.topic]))
             for index, row in enumerate(rows)],
            using,
        )
        LogSequencer.objects.advance(last + len(rows), sequenced_by, using)
    return len(rows), last + len(rows)


def partition_counts(topics: set[str] | list[str], using: str) -> dict[str, int]:
    """Each topic's recorded partition count, recording the configured one for new topics."""
    conf = get_settings()
    return Topic.objects.record({topic: conf.partitions_for(topic) for topic in topics}, using)


def sequence_all(using: str = "default", sequenced_by: str = "") -> int:
    """Sequence until nothing committed is left unsequenced (tests, tools, the demo)."""
    total = 0
    while True:
        count = sequence_pending(using, sequenced_by)
        total += count
        if count < SEQUENCE_BATCH:
            return total
