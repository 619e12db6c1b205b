"""What the delivery state statements take and return: message references, a group's
delivery row, a message read for a group, a hold; and the WHERE clause naming messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..db import arrays
from ..db import sql as sqlb
from ..db.vendor import Vendored
from ..store.messages import MessageRow

_PK = ("consumer_group", "topic", "partition_key", "message_offset")
# retry_count of a row written for a message that was read but not yet delivered (delayed,
# or waiting behind an earlier message of its key): the first delivery makes it 0.
NEVER_DELIVERED = -1


class MessageRef(NamedTuple):
    partition: str
    offset: int


class DeliveryRow(NamedTuple):
    """A group's delivery state for one message."""

    acked: bool
    retry_count: int  # NEVER_DELIVERED, or redeliveries so far (attempt = retry_count + 1)
    invisible_until: int  # epoch ms, database clock
    last_error: str
    # Handed to a handler that has reported no outcome yet (read where it matters: the
    # window a worker rebuilds).
    in_flight: bool = False


class ReadRow(NamedTuple):
    """A message read for a group: the log row and, if it has one, its delivery state."""

    partition: str
    message: MessageRow
    delivery: DeliveryRow | None


class CancelView(NamedTuple):
    """A group's delivery row of one message, as a cancellation judges it."""

    acked: bool
    retry_count: int
    invisible_until: int  # epoch ms, database clock
    last_error: str
    in_flight: bool
    parked: int

    def running(self) -> bool:
        """Handed to a handler whose outcome is not recorded yet. Whatever its visibility:
        a worker that stalled, or a handler past MAX_HANDLER_TIME, still runs it or starts
        it from its queue of handed-out messages. Rows written before ``in_flight`` existed
        count as running on their first attempt."""
        return (not self.acked and self.retry_count > NEVER_DELIVERED
                and (self.in_flight or self.last_error == ""))


class Hold(NamedTuple):
    """A message read but not delivered yet, kept invisible until ``until`` (epoch ms)."""

    partition: str
    offset: int
    until: int


def refs_sql(connection: Vendored, refs: Sequence[MessageRef]) -> tuple[str, list[object]]:
    """The WHERE term naming ``refs`` among a group's delivery rows.

    On PostgreSQL, ``(partition_key = ? AND message_offset = ANY(?)) OR ...``, each
    partition's offsets one array parameter: the text depends on the number of partitions
    only (see :mod:`django_sqlqueue.db.arrays`). Not a join with an unnested list of pairs:
    where the statistics say the table is nearly empty (a queue that has just drained),
    the planner loops over the group's rows and searches the whole list for each.

    Elsewhere ``partition_key IN (...) AND ((partition_key = ? AND message_offset IN
    (...)) OR ...)``. A row-value list ``(partition_key, message_offset) IN ((..), ..)`` would be shorter, but
    MariaDB plans a long one as a scan of the whole group. Even this form is planned as a
    scan on a small table, which is why every statement using it also pins the primary key
    (:func:`vendor.force_index_sql`): a scan locks rows of partitions other workers own.
    """
    q = sqlb.quoter(connection)
    by_partition: dict[str, list[int]] = {}
    for partition, offset in refs:
        by_partition.setdefault(partition, []).append(offset)
    if connection.vendor == "postgresql":
        term = f"({q('partition_key')} = %s AND {q('message_offset')} = ANY(%s::bigint[]))"
        return (
            "(" + " OR ".join([term] * len(by_partition)) + ")",
            [v for partition, offsets in by_partition.items()
             for v in (partition, arrays.int_array(offsets))],
        )
    terms, params = [], []
    for partition, offsets in by_partition.items():
        terms.append(
            f"({q('partition_key')} = %s AND {q('message_offset')} IN "
            f"({sqlb.placeholders(len(offsets))}))"
        )
        params += [partition, *offsets]
    partitions = list(by_partition)
    return (
        f"{q('partition_key')} IN ({sqlb.placeholders(len(partitions))}) AND ("
        + " OR ".join(terms) + ")",
        [*partitions, *params],
    )
