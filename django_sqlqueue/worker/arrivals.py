"""New messages in the log: the committed backlog sequenced, and the partitions that got
messages told so (a partition with nothing new and nothing due needs no poll cycle)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import DatabaseError

from ..db.errors import is_disconnect, is_transient
from ..models import QueueMessage
from ..sequencing import sequence_once
from .partitions import Ident, Partition

SEQUENCE_ROUNDS = 5  # sequencing transactions at most per poll


def sequence_backlog(head: int, using: str, worker_name: str,
                     wait: bool = False) -> tuple[int, bool]:
    """Sequence the backlog, a few batches per poll; return the new log head and whether
    committed messages may still wait (another worker is sequencing, or more than this
    poll's rounds were waiting).

    With ``wait`` (an idle worker, which has nothing to do but what is being sequenced),
    another worker's sequencing is waited for, a few milliseconds, and what it left is
    sequenced here: the positions are then known in this poll rather than the next.
    """
    for _ in range(SEQUENCE_ROUNDS):
        try:
            batch = sequence_once(using, worker_name, wait=wait)
        except DatabaseError as exc:
            if not wait or is_disconnect(exc) or not is_transient(exc):
                raise
            # Held longer than the session's lock wait (an operator's repartition): go on
            # as a busy sequencer would have it.
            return head, True
        if batch.last_position is None:
            return head, True
        head = max(head, batch.last_position)
        if not batch.more or batch.positioned == 0:
            return head, batch.more
    return head, True


def note_new_messages(partitions: dict[Ident, Partition], seen: int, head: int,
                      topics: list[str], groups: dict[str, set[str]], using: str) -> None:
    """Tell the held partitions that got messages between log positions ``seen`` and
    ``head`` how far they now reach; ``groups`` are the groups this worker runs per topic."""
    note_heads(partitions, QueueMessage.objects.partition_heads(seen, head, topics, using),
               groups)


def note_heads(partitions: dict[Ident, Partition], heads: Iterable[tuple[str, str, int]],
               groups: dict[str, set[str]]) -> None:
    """Record the newest position of each partition that got messages, for the held ones.

    ``heads`` is (topic, partition, highest new position).
    """
    for topic, number, position in heads:
        for group in groups.get(topic, ()):
            partition = partitions.get((group, topic, number))
            if partition is not None and (partition.head is None or position > partition.head):
                partition.head = position
