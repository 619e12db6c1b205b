"""SQL for ``queue_subscriber_heartbeats``: a subscriber's sign of life, and its end.

The worker runs it on its Django connection (through
:class:`django_sqlqueue.models.SubscriberHeartbeat`), a Spark stream on a plain one.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..db import sql as sqlb
from ..limits import SUBSCRIBER_NAME_LENGTH
from .connection import Connection

_KEY = ("consumer_group", "topic", "subscriber_name")


def _time_sql(conn: Connection, now_ms: int | None) -> tuple[str, list[int]]:
    """The time to write: ``now_ms`` as read by the caller, else the database clock."""
    return (conn.now_ms_sql(), []) if now_ms is None else ("%s", [now_ms])


def beat(conn: Connection, group: str, topic: str, name: str, now_ms: int | None = None) -> None:
    """Insert or refresh the heartbeat of subscriber ``name`` of ``group`` on ``topic``, at
    ``now_ms`` (epoch ms, database clock; read now when not given)."""
    beat_many(conn, [(group, topic)], name, now_ms)


BEATS_PER_STATEMENT = 200


def beat_many(conn: Connection, subscriptions: Sequence[tuple[str, str]], name: str,
              now_ms: int | None = None, liveness_token: str = "") -> None:
    """:func:`beat` for each (group, topic) of ``subscriptions``, one statement per 200:
    a worker's heartbeats cost the same statement however many subscriptions it runs.
    Rows are written in key order, so two writers never wait on each other in a ring.
    ``liveness_token``: the worker's token while it holds its liveness lock, else ''."""
    q = conn.q
    now, now_params = _time_sql(conn, now_ms)
    tail = sqlb.on_conflict_update(conn, "queue_subscriber_heartbeats", _KEY,
                                   {"heartbeat_at": "{new}", "deregistered_at": "0",
                                    "liveness_token": "{new}"})
    subscriber = name[:SUBSCRIBER_NAME_LENGTH]
    for batch in sqlb.chunks(sorted(set(subscriptions)), BEATS_PER_STATEMENT):
        conn.execute(
            f"INSERT INTO {q('queue_subscriber_heartbeats')} ({', '.join(q(c) for c in _KEY)}, "  # noqa: S608 - names quoted, values bound
            f"{q('heartbeat_at')}, {q('deregistered_at')}, {q('liveness_token')}) VALUES "
            + ", ".join([f"(%s, %s, %s, {now}, 0, %s)"] * len(batch)) + tail,
            [v for group, topic in batch
             for v in (group, topic, subscriber, *now_params, liveness_token)],
        )


def deregister(conn: Connection, name: str, *, group: str | None = None,
               now_ms: int | None = None) -> int:
    """Mark subscriber ``name`` (of ``group`` only, if given) as stopped; return the rows."""
    q = conn.q
    now, now_params = _time_sql(conn, now_ms)
    in_group = "" if group is None else f" AND {q('consumer_group')} = %s"
    return conn.execute(
        f"UPDATE {q('queue_subscriber_heartbeats')} SET {q('deregistered_at')} = {now} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('subscriber_name')} = %s{in_group}",
        [*now_params, name[:SUBSCRIBER_NAME_LENGTH], *([] if group is None else [group])],
    )


def live_others(conn: Connection, group: str, topic: str, prefix: str, alive_ms: int) -> list[str]:
    """Names of live subscribers of ``group`` on ``topic`` whose name does not start with
    ``prefix``: runqueueworker processes, which must not share a group with a stream."""
    q = conn.q
    rows = conn.fetch_all(
        f"SELECT {q('subscriber_name')} FROM {q('queue_subscriber_heartbeats')} "  # noqa: S608 - names quoted, values bound
        f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('deregistered_at')} = 0 "
        f"AND {q('heartbeat_at')} > {conn.now_ms_sql()} - %s",
        [group, topic, alive_ms],
    )
    return [r[0] for r in rows if not str(r[0]).startswith(prefix)]
