"""Batch reads: the log (or its dead letters) by offset range, and the state tables.

Every committed message is read, sequenced or not (``position`` null until the sequencer
reaches it), split into ``numPartitions`` input partitions by offset range. Readers are
pickled to the executors: they carry options, never a connection, and open one in
:meth:`SqlQueueReader.read`. They read the ``readUrl`` replica when given: a batch read
writes nothing and a replica's lag only makes it a slightly older snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..store import message_scans
from ..store.connection import open_connection
from .options import Options
from .tables import read_state, to_batch


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Offsets in (after, up_to] of the log; the state tables are read as one range."""

    after: int
    up_to: int


def offset_ranges(options: Options) -> list[OffsetRange]:
    """The input partitions of a batch read: equal offset ranges over what is stored."""
    if options.table not in ("messages", "dead_letters"):
        return [OffsetRange(0, 0)]
    with open_connection(options.batch_url) as conn:
        bounds = message_scans.offset_bounds(conn, options.topics,
                                             dead_letters=options.table == "dead_letters")
        conn.rollback()
    if bounds is None:
        return [OffsetRange(0, 0)]
    low, high = bounds[0] - 1, bounds[1]
    count = max(1, min(options.num_partitions, high - low))
    step = -(-(high - low) // count)  # ceiling: the last range ends at high
    return [OffsetRange(start, min(start + step, high)) for start in range(low, high, step)]


class SqlQueueReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> list[OffsetRange]:
        return offset_ranges(self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        options = self.options
        offsets = partition if isinstance(partition, OffsetRange) else OffsetRange(0, 0)
        with open_connection(options.batch_url) as conn:
            if options.table not in ("messages", "dead_letters"):
                rows = read_state(conn, options.table, options.topics)
                conn.rollback()
                if rows:
                    yield to_batch(options.table, rows)
                return
            positions = None
            if options.start_position is not None or options.end_position is not None:
                positions = (options.start_position or 0,
                             options.end_position if options.end_position is not None else 2**62)
            after = offsets.after
            while after < offsets.up_to:
                rows = message_scans.read_page(
                    conn, options.topics, after, offsets.up_to, options.page_size,
                    positions=positions, dead_letters=options.table == "dead_letters")
                conn.rollback()  # end the read's transaction: no snapshot held between pages
                if not rows:
                    return
                yield to_batch(options.table, rows)
                after = int(rows[-1][0])
