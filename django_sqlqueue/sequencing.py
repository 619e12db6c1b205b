"""The sequencer: gives committed messages their consumable position, in commit order.

Any worker may run it; the counter row's lock (taken with SKIP LOCKED) makes one of them
do it at a time and lets the others carry on. See docs/data-model.md for why offsets
alone are not safe to consume by.
"""

from __future__ import annotations

from django.db import transaction

from .models import LogSequencer, QueueMessage

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
        offsets = QueueMessage.objects.unsequenced_offsets(limit, using)
        if not offsets:
            return 0, last
        QueueMessage.objects.assign_positions(offsets, last + 1, using)
        LogSequencer.objects.advance(last + len(offsets), sequenced_by, using)
    return len(offsets), last + len(offsets)


def sequence_all(using: str = "default", sequenced_by: str = "") -> int:
    """Sequence until nothing committed is left unsequenced (tests, tools, the demo)."""
    total = 0
    while True:
        count = sequence_pending(using, sequenced_by)
        total += count
        if count < SEQUENCE_BATCH:
            return total
