"""The worker's sequencing: :mod:`django_sqlqueue.store.sequencer` on a Django connection,
recording the configured partition count of a topic met for the first time.

Positions keep every transaction's messages in publish order and follow commit order across
sequencing batches; docs/data-model.md, "The order consumers see", states it exactly.

Partitions are assigned when a message is positioned rather than at publish time, under the
counter's lock, from the count recorded in ``queue_topics``. A change of a topic's count (see
:mod:`django_sqlqueue.repartition`) takes that lock too, so no message is ever mapped with a
count other than the one its topic had when it was positioned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from .conf import get_settings, queue_database
from .db.schema_state import holds_queue_table
from .models import Topic
from .store import sequencer
from .store.connection import Connection, django_connection
from .store.sequencer import SEQUENCE_BATCH, Batch

__all__ = ["SEQUENCE_BATCH", "Batch", "partition_counts", "record_configured_topics",
           "sequence_all", "sequence_batch", "sequence_once", "sequence_pending"]


def sequence_once(using: str | None = None, sequenced_by: str = "",
                  limit: int = SEQUENCE_BATCH, *, wait: bool = False) -> Batch:
    """Position up to ``limit`` committed messages in one transaction; see :class:`Batch`.
    With ``wait``, waits for another process that is sequencing instead of returning."""
    using = using or queue_database()
    return sequencer.sequence_batch(django_connection(using), sequenced_by,
                                    counts_for=_configured_counts(using), limit=limit,
                                    wait=wait)


def sequence_pending(using: str | None = None, sequenced_by: str = "",
                     limit: int = SEQUENCE_BATCH) -> int:
    """Position up to ``limit`` committed, unsequenced messages; return how many.

    Returns 0 when another worker is sequencing right now or nothing is waiting.
    """
    using = using or queue_database()
    return sequence_once(using, sequenced_by, limit).positioned


def sequence_batch(using: str | None = None, sequenced_by: str = "",
                   limit: int = SEQUENCE_BATCH) -> tuple[int, int | None]:
    """Like sequence_pending(), also returning the last position now assigned (the log
    head), or None when another worker holds the sequencer."""
    using = using or queue_database()
    batch = sequence_once(using, sequenced_by, limit)
    return batch.positioned, batch.last_position


def sequence_all(using: str | None = None, sequenced_by: str = "") -> int:
    """Sequence until nothing committed is left unsequenced (tests, tools, the demo)."""
    using = using or queue_database()
    return sequencer.sequence_all(django_connection(using), sequenced_by,
                                  counts_for=_configured_counts(using)).positioned


def partition_counts(topics: set[str] | list[str], using: str) -> dict[str, int]:
    """Each topic's recorded partition count, recording the configured one for new topics."""
    conf = get_settings()
    return Topic.objects.record({topic: conf.partitions_for(topic) for topic in topics}, using)


def record_configured_topics(using: str | None = None) -> dict[str, int]:
    """Record the configured count of every topic named in ``SQLQUEUE["TOPICS"]`` that has
    none yet (``migrate`` and a worker's start), so a Spark job can write to it and a stream
    read it without a worker having met it first. Returns their recorded counts."""
    using = using or queue_database()
    return partition_counts(sorted(get_settings().topics), using)


def record_topics_after_migrate(using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """``post_migrate`` receiver: :func:`record_configured_topics` once the table exists."""
    if holds_queue_table(using, Topic._meta.db_table):
        record_configured_topics(using)


def _configured_counts(using: str) -> sequencer.CountsFor:
    def counts_for(_conn: Connection, topics: Sequence[str]) -> Mapping[str, int]:
        return partition_counts(list(topics), using)
    return counts_for
