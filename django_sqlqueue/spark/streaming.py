"""Streaming reads: the log followed by position, as Spark follows a Kafka topic.

The stream's offset is a log position. Before planning a batch the driver sequences the
log (a topic only Spark reads has no worker to do it) and plans only up to the last
position handed out: a message whose transaction commits late gets a later position, so
it is read in a later batch instead of being skipped.

With ``group`` the stream is a consumer group: from its start it has watermark rows (GC
waits for it, the admin shows its lag) and a heartbeat, and Spark's commit of a batch
moves its watermarks, never past a message the stream did not read. A query without a
checkpoint resumes from the group's watermarks. Spark commits batch N only when it plans
batch N+1, so between runs the group trails by one batch. Without a group GC does not
wait: a stream that falls behind GC fails (or, with ``failOnDataLoss=false``, warns and
goes on).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..exceptions import SQLQueueError
from ..partitioning import partition_names
from ..replays import replay_target
from ..store import heartbeats, message_scans, offsets, sequencer
from ..store import topics as topic_store
from ..store.connection import Connection, open_connection
from .options import Options, SparkOptionError
from .tables import to_batch

logger = logging.getLogger("django_sqlqueue.spark")
POSITION, TOPIC, PARTITION, HEADERS = (message_scans.READ_COLUMNS.index(column)
                                       for column in ("position", "topic", "partition", "headers"))

SUBSCRIBER_PREFIX = "spark:"  # heartbeat names of streams, told apart from runqueueworker's
LIVE_WORKER_MS = 60_000  # a worker heartbeat this recent counts as a running worker


class DataLoss(SQLQueueError):
    """Messages a stream without a consumer group had not read yet were collected by GC."""


@dataclass(frozen=True)
class PositionRange(InputPartition):
    """Positions in (after, up_to] of the stream's topics."""

    after: int
    up_to: int


class SqlQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.name = f"{SUBSCRIBER_PREFIX}{uuid.uuid4().hex[:16]}"
        self._target: int | None = None  # the end of a trigger(availableNow=True) run
        self._conn: Connection | None = None
        self._registered = False

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to the executors for read(): the driver's connection stays behind.
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    # ------------------------------------------------------------------ driver side

    def _db(self) -> Connection:
        if self._conn is None:
            self._conn = open_connection(self.options.url)
        return self._conn

    def _sequence(self) -> int:
        """Position what has committed; return the last position handed out."""
        conn = self._db()
        with conn.atomic():
            unrecorded = topic_store.unrecorded(conn, list(self.options.topics))
        if unrecorded:
            raise SparkOptionError(topic_store.unrecorded_error(unrecorded))
        sequencer.sequence_all(conn, self.name, max_batches=20)
        with conn.atomic():
            return sequencer.last_position(conn)

    def _register(self, fresh_at: int) -> None:
        """Make the group a registered consumer of every topic (once per query).

        A topic the group has no watermarks on yet gets them at ``fresh_at``: the group
        starts there. Watermarks it has are its recorded progress and stay as they are (a
        partition missing among them starts at 0: nothing of it is consumed).
        """
        group = self.options.group
        if group is None or self._registered:
            return
        conn = self._db()
        with conn.atomic():
            counts = topic_store.partition_counts(conn, list(self.options.topics))
            for topic in self.options.topics:
                if topic not in counts:
                    raise SparkOptionError(
                        f"topic {topic!r} has no recorded partition count yet, so group {group!r} "
                        "cannot register for it: start a runqueueworker for it once, or write to it "
                        'with .option("partitions", N)')
                workers = heartbeats.live_others(conn, group, topic, SUBSCRIBER_PREFIX,
                                                 LIVE_WORKER_MS)
                if workers:
                    raise SparkOptionError(
                        f"group {group!r} is consumed by running workers ({', '.join(workers[:3])}); "
                        "a stream needs a consumer group of its own")
                known = bool(offsets.watermarks(conn, group, topic))
                offsets.ensure(conn, group, topic, partition_names(counts[topic]),
                               at=0 if known else fresh_at)
                heartbeats.beat(conn, group, topic, self.name)
        self._registered = True

    def _beat(self) -> None:
        group = self.options.group
        if group is None:
            return
        conn = self._db()
        with conn.atomic():
            for topic in self.options.topics:
                heartbeats.beat(conn, group, topic, self.name)

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
        """Where a query without a checkpoint starts.

        A group resumes from its recorded progress: just below the lowest message it has
        not consumed in any partition, whatever ``startingPosition`` says (messages of
        other partitions it had consumed are passed over in :meth:`read`). A group new to
        a topic, like a stream without a group, starts at ``startingPosition``; with
        ``latest`` its watermarks start at the head, so what came before is not its own.
        """
        head = self._sequence()
        latest = self.options.starting_position == "latest"
        group = self.options.group
        if group is not None:
            self._register(fresh_at=head if latest else 0)
            conn = self._db()
            with conn.atomic():
                unread = [position for topic in self.options.topics
                          for position in message_scans.nearest_above(
                              conn, topic, offsets.watermarks(conn, group, topic)).values()]
            return {"position": min(unread) - 1 if unread else head}
        if latest:
            return {"position": head}
        conn = self._db()
        with conn.atomic():
            lowest = message_scans.lowest_position(conn, list(self.options.topics))
        return {"position": head if lowest is None else lowest - 1}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        if self.options.max_rows_per_batch:
            return ReadMaxRows(self.options.max_rows_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self._target = self._sequence()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802 - Spark's name
        # A query resumed from its checkpoint: everything up to ``start`` was read by it.
        self._register(fresh_at=int(start["position"]))
        self._beat()
        head = self._sequence()
        if self._target is not None:
            head = min(head, self._target)
        after = int(start["position"])
        if head <= after:
            return {"position": after}
        if isinstance(limit, ReadMaxRows):
            conn = self._db()
            with conn.atomic():
                nth = message_scans.nth_position(conn, list(self.options.topics), after, head,
                                                 limit.max_rows)
            if nth is not None:
                head = nth
        return {"position": head}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[PositionRange]:
        after, up_to = int(start["position"]), int(end["position"])
        if up_to <= after:
            return []
        count = max(1, min(self.options.num_partitions, up_to - after))
        step = -(-(up_to - after) // count)
        return [PositionRange(low, min(low + step, up_to)) for low in range(after, up_to, step)]

    def commit(self, end: dict[str, int]) -> None:
        """Spark finished every batch up to ``end``: move the group's watermarks there.

        Each partition's watermark moves to its last message at or below ``end``. Every
        message of the partition between its watermark and ``end`` was handed to Spark:
        the query started below the first one the group had not consumed.
        """
        group = self.options.group
        if group is None:
            return
        up_to = int(end["position"])
        conn = self._db()
        with conn.atomic():
            for topic in self.options.topics:
                marks = offsets.watermarks(conn, group, topic)
                offsets.advance(conn, group, topic,
                                message_scans.nearest_above(conn, topic, marks, up_to=up_to))
                offsets.touch(conn, group, topic)

    def stop(self) -> None:
        if self._conn is None:
            return
        try:
            if self.options.group is not None:
                with self._conn.atomic():
                    heartbeats.deregister(self._conn, self.name, group=self.options.group)
        finally:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------ executor side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, PositionRange):
            return
        options = self.options
        with open_connection(options.url) as conn:
            consumed: dict[tuple[str, str], int] = {}
            if options.group is None:
                self._check_data_loss(conn, partition)
            else:
                consumed = self._watermarks(conn, options.group)
            after = partition.after
            while after < partition.up_to:
                rows = message_scans.read_positions(conn, list(options.topics), after,
                                                    partition.up_to, options.page_size)
                conn.rollback()
                if not rows:
                    return
                after = int(rows[-1][1])
                if options.group is not None:
                    # A replayed dead letter is meant for the group that failed it only;
                    # a message at or below its partition's watermark was consumed by the
                    # group before this query (it resumed below it for another partition).
                    rows = [row for row in rows
                            if replay_target(row[HEADERS]) in (None, options.group)
                            and row[POSITION] > consumed.get((row[TOPIC], str(row[PARTITION])), 0)]
                    if not rows:
                        continue
                yield to_batch("messages", rows)

    def _watermarks(self, conn: Connection, group: str) -> dict[tuple[str, str], int]:
        marks = {(topic, partition): mark for topic in self.options.topics
                 for partition, mark in offsets.watermarks(conn, group, topic).items()}
        conn.rollback()
        return marks

    def _check_data_loss(self, conn: Connection, partition: PositionRange) -> None:
        """Fail (or warn) if GC may have deleted messages of this range before it was read.

        GC deletes a partition's messages up to the lowest watermark of the registered
        groups. Where that lies above the range's start and positions in the range are
        missing (positions are handed out without gaps), messages were collected unread.
        """
        horizon = 0
        for topic in self.options.topics:
            horizon = max(horizon, max(offsets.gc_horizons(conn, topic).values(), default=0))
        conn.rollback()
        if horizon <= partition.after:
            return
        up_to = min(partition.up_to, horizon)
        present = message_scans.count_positions(conn, partition.after, up_to)
        conn.rollback()
        if present >= up_to - partition.after:
            return
        text = (f"messages of {','.join(self.options.topics)} between positions "
                f"{partition.after} and {up_to} were deleted by GC before this stream read them "
                f"({up_to - partition.after - present} positions missing); a stream without "
                'option group does not hold GC back: use .option("group", ...) to keep them')
        if self.options.fail_on_data_loss:
            raise DataLoss(text + ', or .option("failOnDataLoss", "false") to go on')
        logger.warning("spark stream data loss: %s", text)
