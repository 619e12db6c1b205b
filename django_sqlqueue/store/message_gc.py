"""What garbage collection deletes from the log (``queue_messages``): the messages every
registered group's watermark has passed and none of them still waits on, and the DELETE.

The worker's collector (:mod:`django_sqlqueue.worker.collector`) decides the horizons
(:func:`django_sqlqueue.store.offsets.gc_horizons`); this module finds and deletes rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..db import sql as sqlb
from ..db import vendor
from .connection import Connection


def _still_waiting_sql(conn: Connection, alias: str, groups: Sequence[str]) -> tuple[str, list[Any]]:
    """`` AND NOT EXISTS (...)``: the message (``alias``) is not parked and unacked by any of
    ``groups``; one primary-key probe per group."""
    if not groups:
        return "", []
    q = conn.q
    return (
        f" AND NOT EXISTS (SELECT 1 FROM {q('queue_delivery_state')} d "  # noqa: S608 - names quoted, values bound
        f"WHERE d.{q('consumer_group')} IN ({sqlb.placeholders(len(groups))}) "
        f"AND d.{q('topic')} = {alias}.{q('topic')} "
        f"AND d.{q('partition_key')} = {alias}.{q('partition_key')} "
        f"AND d.{q('message_offset')} = {alias}.{q('offset')} AND d.{q('parked')} > 0 "
        f"AND d.{q('acked')} = {vendor.false_sql(conn)})",
        list(groups),
    )


def collectable_offsets(conn: Connection, topic: str, partition: str, after_position: int,
                        up_to_position: int, limit: int, groups: Sequence[str]
                        ) -> list[tuple[int, int]]:
    """(offset, position) of up to ``limit`` messages of the partition positioned in
    (after, up_to], lowest first, that none of ``groups`` has parked and not yet acked
    (a waiting message the watermark passed: see models.waiting)."""
    q = conn.q
    waiting, waiting_params = _still_waiting_sql(conn, "m", groups)
    return [(int(r[0]), int(r[1])) for r in conn.fetch_all(
        f"SELECT m.{q('offset')}, m.{q('position')} FROM {q('queue_messages')} m "  # noqa: S608 - names quoted, values bound
        f"WHERE m.{q('topic')} = %s AND m.{q('partition_key')} = %s "
        f"AND m.{q('position')} > %s AND m.{q('position')} <= %s{waiting} "
        f"ORDER BY m.{q('position')} LIMIT %s",
        [topic, partition, after_position, up_to_position, *waiting_params, limit],
    )]


def collectable_among(conn: Connection, topic: str, offsets: Sequence[int], up_to_position: int,
                      groups: Sequence[str]) -> list[int]:
    """Which of ``offsets`` (messages of one partition that were parked) are positioned
    at or below ``up_to_position`` and no longer waiting for any of ``groups``."""
    if not offsets:
        return []
    q = conn.q
    waiting, waiting_params = _still_waiting_sql(conn, "m", groups)
    return [int(r[0]) for r in conn.fetch_all(
        f"SELECT m.{q('offset')} FROM {q('queue_messages')} m "  # noqa: S608 - names quoted, values bound
        f"WHERE m.{q('offset')} IN ({sqlb.placeholders(len(offsets))}) AND m.{q('topic')} = %s "
        f"AND m.{q('position')} <= %s{waiting}",
        [*offsets, topic, up_to_position, *waiting_params],
    )]


def delete_offsets(conn: Connection, offsets: Sequence[int]) -> int:
    """Delete the messages ``offsets``, reading only their rows (the primary key)."""
    q = conn.q
    return conn.execute(
        f"{sqlb.delete_from(conn, 'queue_messages')} WHERE {q('offset')} IN "
        f"({sqlb.placeholders(len(offsets))})",
        list(offsets),
    )
