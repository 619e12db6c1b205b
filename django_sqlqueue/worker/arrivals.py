"""New messages in the log: the committed backlog sequenced, and the partitions that got
messages told so (a partition with nothing new and nothing due needs no poll cycle)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

from django.db import DatabaseError, connections

from ..db.errors import is_disconnect, is_transient
from ..models import GroupControl, LogSequencer, QueueMessage
from ..sequencing import sequence_once
from .clock import DatabaseClock
from .controls import Controls
from .partitions import Ident, Partition

SEQUENCE_ROUNDS = 5  # sequencing transactions at most per poll


class Backlog(NamedTuple):
    """What sequencing the backlog did in one poll."""

    head: int  # the log head now
    pending: bool  # committed messages may still wait
    # The log head before this poll's batches, when they numbered every position from it
    # to ``head`` (no other worker numbered any in between); None otherwise.
    since: int | None = None
    heads: tuple[tuple[str, str, int], ...] = ()  # see Batch.heads, over the batches


class HeadPoll:
    """A poll's first read: the log head, whether committed messages wait unsequenced, the
    database clock and the operator controls' version, in one statement.

    A poll that a notification started skips it while the last one is younger than
    ``every`` seconds: a message has just committed, and sequencing reads the head itself.
    That is one statement fewer between a commit and its handler; the clock and the
    controls are read again within ``every``, as they would be without notifications.
    """

    def __init__(self, using: str, clock: DatabaseClock, controls: Controls,
                 every: float) -> None:
        self.using = using
        self.clock = clock
        self.controls = controls
        self.every = every
        self._read_at = float("-inf")  # time.monotonic() of the last read

    def read(self, seen_head: int, notified: bool) -> tuple[int, bool]:
        """(log head, whether unsequenced messages may wait)."""
        now = time.monotonic()
        if notified and now - self._read_at < self.every:
            return seen_head, True
        head, pending, db_now, controls = LogSequencer.objects.poll_head(
            self.using, GroupControl.objects.version_sql(connections[self.using]))
        self._read_at = now
        self.clock.sync(db_now)
        self.controls.note_version(controls)
        return head, pending


def sequence_backlog(head: int, using: str, worker_name: str,
                     wait: bool = False) -> Backlog:
    """Sequence the backlog, a few batches per poll; return the new log head and whether
    committed messages may still wait (another worker is sequencing, or more than this
    poll's rounds were waiting).

    With ``wait`` (an idle worker, which has nothing to do but what is being sequenced),
    another worker's sequencing is waited for, a few milliseconds, and what it left is
    sequenced here: the positions are then known in this poll rather than the next.
    """
    since: int | None = None
    chained = True  # every batch began where the one before it ended
    heads: dict[tuple[str, str], int] = {}
    for _ in range(SEQUENCE_ROUNDS):
        try:
            batch = sequence_once(using, worker_name, wait=wait)
        except DatabaseError as exc:
            if not wait or is_disconnect(exc) or not is_transient(exc):
                raise
            # Held longer than the session's lock wait (an operator's repartition): go on
            # as a busy sequencer would have it.
            return Backlog(head, True)
        if batch.last_position is None:
            return Backlog(head, True)
        began = batch.last_position - batch.positioned
        if since is None:
            since = began
        elif began != head:
            chained = False
        head = max(head, batch.last_position)
        for topic, partition, position in batch.heads:
            heads[(topic, partition)] = position
        if not batch.more or batch.positioned == 0:
            return _backlog(head, batch.more, since if chained else None, heads)
    return _backlog(head, True, since if chained else None, heads)


def _backlog(head: int, pending: bool, since: int | None,
             heads: dict[tuple[str, str], int]) -> Backlog:
    return Backlog(head, pending, since,
                   tuple((topic, partition, position)
                         for (topic, partition), position in heads.items()))


def note_new_messages(partitions: dict[Ident, Partition], seen: int, head: int,
                      topics: list[str], groups: dict[str, set[str]], using: str,
                      backlog: Backlog | None = None) -> None:
    """Tell the held partitions that got messages between log positions ``seen`` and
    ``head`` how far they now reach; ``groups`` are the groups this worker runs per topic.

    When this poll's ``backlog`` numbered every position from ``seen`` to ``head`` (no
    other worker numbered any in between), it already knows which partitions got them:
    the log is not read again, a round trip less between a commit and its handler."""
    if backlog is not None and backlog.since == seen and backlog.head == head:
        note_heads(partitions, backlog.heads, groups)
        return
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
