"""The writes of ``queue_delivery_state``: deliver, hold, ack, nack, undo a delivery, extend,
make due, delete. The worker runs them inside its fenced poll transaction (see
:class:`django_sqlqueue.models.delivery.DeliveryStateManager`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connections, models

from ..db import arrays, vendor
from ..db import sql as sqlb
from ..db.exact_names import binary_collation
from .delivery_rows import _PK, NEVER_DELIVERED, Hold, MessageRef, refs_sql
from .fields import storable_error


class DeliveryWrites(models.Manager[Any]):
    """The writes of :class:`django_sqlqueue.models.delivery.DeliveryStateManager`."""

    def mark_delivered(
        self, group: str, topic: str, refs: Sequence[MessageRef], invisible_until: int,
        using: str,
    ) -> None:
        """Make messages invisible until ``invisible_until``; a redelivery bumps retry_count."""
        # One row per message: PostgreSQL refuses an upsert that reaches one row twice
        # ("ON CONFLICT DO UPDATE command cannot affect row a second time"), and MariaDB
        # and SQLite would count the redelivery twice.
        refs = list(dict.fromkeys(MessageRef(*ref) for ref in refs))
        if not refs:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        false, true = vendor.false_sql(connection), vendor.true_sql(connection)
        columns = ", ".join(q(c) for c in (*_PK, "acked", "invisible_until", "retry_count",
                                           "last_error", "in_flight"))
        tail = sqlb.on_conflict_update(connection, "queue_delivery_state", _PK, {
            "retry_count": "{old} + 1", "invisible_until": "{new}", "in_flight": "{new}",
        })
        if connection.vendor == "postgresql":  # one short text for any batch: see db.arrays
            sqlb.execute(
                connection,
                f"INSERT INTO {q('queue_delivery_state')} ({columns}) "  # noqa: S608 - names quoted, values bound
                f"SELECT %s, %s, r.p, r.o, {false}, %s, 0, '', {true} "
                f"FROM unnest(%s::text[], %s::bigint[]) AS r(p, o){tail}",
                [group, topic, invisible_until, arrays.text_array([ref[0] for ref in refs]),
                 arrays.int_array([ref[1] for ref in refs])],
            )
            return
        if vendor.has_json_table(connection):  # MariaDB: the batch as one JSON parameter
            sqlb.execute(
                connection,
                f"INSERT INTO {q('queue_delivery_state')} ({columns}) "  # noqa: S608 - names quoted, values bound
                f"SELECT %s, %s, r.p, r.o, {false}, %s, 0, '', {true} FROM JSON_TABLE(%s, "
                f"'$[*]' COLUMNS (p LONGTEXT PATH '$[0]', o BIGINT PATH '$[1]')) AS r{tail}",
                [group, topic, invisible_until,
                 json.dumps([list(ref) for ref in refs], ensure_ascii=False)],
            )
            return
        values = ", ".join([f"(%s, %s, %s, %s, {false}, %s, 0, '', {true})"] * len(refs))
        params: list[object] = []
        for partition, offset in refs:
            params += [group, topic, partition, offset, invisible_until]
        sqlb.execute(
            connection,
            f"INSERT INTO {q('queue_delivery_state')} ({columns}) VALUES {values}{tail}",  # noqa: S608 - names quoted, values bound
            params,
        )

    def hold(self, group: str, topic: str, holds: Sequence[Hold], using: str) -> None:
        """Record messages read but not delivered yet (delayed, or behind their key), so a
        worker that takes the partition over finds them without re-reading the log."""
        holds = list({(hold.partition, hold.offset): hold for hold in holds}.values())
        if not holds:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        false = vendor.false_sql(connection)
        prefix, suffix = sqlb.insert_ignore(connection, _PK)
        columns = ", ".join(q(c) for c in (*_PK, "acked", "invisible_until", "retry_count", "last_error"))
        if connection.vendor == "postgresql":  # one short text for any batch: see db.arrays
            sqlb.execute(
                connection,
                f"{prefix} {q('queue_delivery_state')} ({columns}) "  # noqa: S608 - names quoted, values bound
                f"SELECT %s, %s, r.p, r.o, {false}, r.u, {NEVER_DELIVERED}, '' "
                f"FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS r(p, o, u){suffix}",
                [group, topic, arrays.text_array([h.partition for h in holds]),
                 arrays.int_array([h.offset for h in holds]),
                 arrays.int_array([h.until for h in holds])],
            )
            return
        if vendor.has_json_table(connection):  # MariaDB: the batch as one JSON parameter
            sqlb.execute(
                connection,
                f"{prefix} {q('queue_delivery_state')} ({columns}) "  # noqa: S608 - names quoted, values bound
                f"SELECT %s, %s, r.p, r.o, {false}, r.u, {NEVER_DELIVERED}, '' FROM JSON_TABLE(%s, "
                f"'$[*]' COLUMNS (p LONGTEXT PATH '$[0]', o BIGINT PATH '$[1]', "
                f"u BIGINT PATH '$[2]')) AS r{suffix}",
                [group, topic, json.dumps([list(hold) for hold in holds], ensure_ascii=False)],
            )
            return
        for batch in sqlb.chunks(list(holds), 500):
            values = ", ".join([f"(%s, %s, %s, %s, {false}, %s, {NEVER_DELIVERED}, '')"] * len(batch))
            params: list[object] = []
            for partition, offset, until in batch:
                params += [group, topic, partition, offset, until]
            sqlb.execute(
                connection,
                f"{prefix} {q('queue_delivery_state')} ({columns}) VALUES {values}{suffix}",
                params,
            )

    def ack(self, group: str, topic: str, refs: Sequence[MessageRef], using: str,
            error: str = "") -> int:
        """Mark messages done for the group (``error`` is kept when dead-lettering)."""
        if not refs:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        set_error = f", {q('last_error')} = %s" if error else ""
        where, params = refs_sql(connection, refs)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('acked')} = {vendor.true_sql(connection)}"
            f"{set_error} WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where}",
            ([storable_error(error)] if error else []) + [group, topic, *params],
        )

    def ack_failed(self, group: str, topic: str, failures: Sequence[tuple[MessageRef, str]],
                   using: str) -> int:
        """:meth:`ack` with an error for several messages (dead-lettered), each (ref,
        error), in one statement."""
        if not failures:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        error_sql = _case_value(connection, "last_error")
        cases = " ".join([f"WHEN %s THEN {error_sql}"] * len(failures))
        params: list[object] = []
        for ref, error in failures:
            params += [ref.offset, storable_error(error or "dead-lettered")]
        where, where_params = refs_sql(connection, [ref for ref, _ in failures])
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('acked')} = {vendor.true_sql(connection)}, "
            f"{q('last_error')} = CASE {q('message_offset')} {cases} END "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where}",
            [*params, group, topic, *where_params],
        )

    def nack(self, group: str, topic: str, ref: MessageRef, invisible_until: int, error: str,
             using: str) -> int:
        """Make an unacked message visible again at ``invisible_until`` (non-blocking retry)."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_delivery_state')} SET {q('invisible_until')} = %s, "  # noqa: S608 - names quoted, values bound
            f"{q('last_error')} = %s, {q('in_flight')} = {vendor.false_sql(connection)} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('message_offset')} = %s "
            f"AND {q('acked')} = {vendor.false_sql(connection)}",
            [invisible_until, storable_error(error), group, topic, *ref],
        )

    def nack_many(self, group: str, topic: str,
                  nacks: Sequence[tuple[MessageRef, int, str]], using: str) -> int:
        """:meth:`nack` for several messages, each (ref, invisible_until, error), in one
        statement."""
        if not nacks:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        until_sql = _case_value(connection, "invisible_until")
        error_sql = _case_value(connection, "last_error")
        until_cases = " ".join([f"WHEN %s THEN {until_sql}"] * len(nacks))
        error_cases = " ".join([f"WHEN %s THEN {error_sql}"] * len(nacks))
        params: list[object] = []
        for ref, until, _ in nacks:
            params += [ref.offset, until]
        for ref, _, error in nacks:
            params += [ref.offset, storable_error(error)]
        where, where_params = refs_sql(connection, [ref for ref, _, _ in nacks])
        false = vendor.false_sql(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('invisible_until')} = CASE {q('message_offset')} {until_cases} END, "
            f"{q('last_error')} = CASE {q('message_offset')} {error_cases} END, "
            f"{q('in_flight')} = {false} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where} "
            f"AND {q('acked')} = {false}",
            [*params, group, topic, *where_params],
        )

    def undeliver_many(self, group: str, topic: str, refs: Sequence[MessageRef], now_ms: int,
                       using: str) -> int:
        """:meth:`undeliver` for several messages in one statement."""
        if not refs:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        where, params = refs_sql(connection, refs)
        false = vendor.false_sql(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('invisible_until')} = %s, {q('retry_count')} = {q('retry_count')} - 1, "
            f"{q('in_flight')} = {false} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where} "
            f"AND {q('acked')} = {false} AND {q('retry_count')} > {NEVER_DELIVERED}",
            [now_ms, group, topic, *params],
        )

    def undeliver(self, group: str, topic: str, ref: MessageRef, now_ms: int,
                  using: str) -> int:
        """Undo the latest delivery of an unacked message whose handler never started:
        visible again at ``now_ms``, and that delivery no longer counts as an attempt."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_delivery_state')} SET {q('invisible_until')} = %s, "  # noqa: S608 - names quoted, values bound
            f"{q('retry_count')} = {q('retry_count')} - 1, "
            f"{q('in_flight')} = {vendor.false_sql(connection)} "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} = %s AND {q('message_offset')} = %s "
            f"AND {q('acked')} = {vendor.false_sql(connection)} "
            f"AND {q('retry_count')} > {NEVER_DELIVERED}",
            [now_ms, group, topic, *ref],
        )

    def cancel(self, group: str, topic: str, ref: MessageRef, mark: str, using: str) -> None:
        """Mark a message done for the group without running it (a cancellation): its
        row, written if it had none, is acked, so no worker of the group hands it out, the
        watermark passes it, and GC collects it (parked or not). The caller holds the
        partition's lease row locked and has checked that the message is not running;
        ``mark`` goes in ``last_error``, telling a cancelled message from a handled one."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        false, true = vendor.false_sql(connection), vendor.true_sql(connection)
        columns = ", ".join(q(c) for c in (*_PK, "acked", "invisible_until", "retry_count",
                                           "last_error", "in_flight"))
        tail = sqlb.on_conflict_update(connection, "queue_delivery_state", _PK, {
            "acked": "{new}", "in_flight": "{new}", "last_error": "{new}",
        })
        sqlb.execute(
            connection,
            f"INSERT INTO {q('queue_delivery_state')} ({columns}) "  # noqa: S608 - names quoted, values bound
            f"VALUES (%s, %s, %s, %s, {true}, 0, {NEVER_DELIVERED}, %s, {false}){tail}",
            [group, topic, *ref, mark],
        )

    def extend(self, group: str, topic: str, refs: Sequence[MessageRef], invisible_until: int,
               using: str, fence: tuple[str, str, int] | None = None,
               connection: Any = None) -> int:
        """Push back the visibility timeout of in-flight messages, without counting a retry.

        ``fence`` = (worker name, worker token, lease generation) makes the statement check
        ownership itself, for callers outside the worker's fenced poll (a handler's own
        extension). ``connection`` overrides the alias's connection of this thread.
        """
        if not refs:
            return 0
        connection = connection or connections[using]
        q = sqlb.quoter(connection)
        table = q("queue_delivery_state")
        fence_sql, fence_params = "", []
        if fence is not None:
            fence_sql = (
                f" AND EXISTS (SELECT 1 FROM {q('queue_partition_leases')} l "  # noqa: S608 - names quoted, values bound
                f"WHERE l.{q('consumer_group')} = {table}.{q('consumer_group')} "
                f"AND l.{q('topic')} = {table}.{q('topic')} "
                f"AND l.{q('partition_key')} = {table}.{q('partition_key')} "
                f"AND l.{q('leased_by')} = %s AND l.{q('lease_token')} = %s "
                f"AND l.{q('generation')} = %s)"
            )
            fence_params = list(fence)
        where, params = refs_sql(connection, refs)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_delivery_state')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('invisible_until')} = %s "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where} "
            f"AND {q('acked')} = {vendor.false_sql(connection)}{fence_sql}",
            [invisible_until, group, topic, *params, *fence_params],
        )

    def delete_acked(self, group: str, topic: str, refs: Sequence[MessageRef], using: str) -> int:
        """Drop acked rows the watermark has passed; they are never read again."""
        return self._delete(group, topic, refs, using, acked_only=True)

    def delete_refs(self, group: str, topic: str, refs: Sequence[MessageRef], using: str) -> int:
        """Drop the group's rows of messages that were deleted from the log (a discarded
        or replayed dead letter), acked or not."""
        return self._delete(group, topic, refs, using, acked_only=False)

    def _delete(self, group: str, topic: str, refs: Sequence[MessageRef], using: str,
                acked_only: bool) -> int:
        if not refs:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        acked_sql = f" AND {q('acked')} = {vendor.true_sql(connection)}" if acked_only else ""
        if vendor.has_json_table(connection):
            # MariaDB: the batch as one JSON parameter, each row found by its key (the
            # partition read in the names' own binary collation, so the join compares them
            # exactly and can use the key).
            return sqlb.execute(
                connection,
                f"DELETE d FROM JSON_TABLE(%s, '$[*]' COLUMNS (p VARCHAR(255) CHARACTER SET "  # noqa: S608 - names quoted, values bound
                f"utf8mb4 COLLATE {binary_collation(connection)} PATH '$[0]', o BIGINT PATH "
                f"'$[1]')) AS r STRAIGHT_JOIN {q('queue_delivery_state')} d FORCE INDEX (PRIMARY) "
                f"ON d.{q('consumer_group')} = %s AND d.{q('topic')} = %s "
                f"AND d.{q('partition_key')} = r.p AND d.{q('message_offset')} = r.o{acked_sql}",
                [json.dumps([list(ref) for ref in refs], ensure_ascii=False), group, topic],
            )
        deleted = 0
        for batch in sqlb.chunks(list(refs), 500):
            where, params = refs_sql(connection, batch)
            deleted += sqlb.execute(
                connection,
                f"{sqlb.delete_from(connection, 'queue_delivery_state')} "
                f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {where}{acked_sql}",
                [group, topic, *params],
            )
        return deleted

    def make_due(self, group: str, topic: str, ref: MessageRef, now_ms: int,
                 using: str) -> int:
        """Make a message that waits out a delay, a backoff or its key's head deliverable
        now; a message delivered and not failed (running) is left alone."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {q('queue_delivery_state')} SET {q('invisible_until')} = %s "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('partition_key')} = %s "
            f"AND {q('message_offset')} = %s AND {q('acked')} = {vendor.false_sql(connection)} "
            f"AND {q('invisible_until')} > %s "
            f"AND ({q('retry_count')} = {NEVER_DELIVERED} OR {q('last_error')} <> '')",
            [now_ms, group, topic, *ref, now_ms],
        )

    def delete_messages(self, groups: Sequence[str], topic: str, offsets: Sequence[int],
                        using: str) -> int:
        """Delete the groups' rows of these messages of ``topic`` (being deleted from the
        log), a group at a time: each DELETE is then a primary-key range, not a scan of
        other topics'."""
        return sum(self.using(using).filter(consumer_group=group, topic=topic,
                                            message_offset__in=offsets).delete()[0]
                   for group in groups)


# The types of the columns a CASE sets (see _case_value), as the model declares them.
_CASE_TYPES: dict[str, models.Field[Any, Any]] = {
    "invisible_until": models.BigIntegerField(), "last_error": models.TextField()}


def _case_value(connection: Any, column: str) -> str:
    """The placeholder of a THEN value for ``column``: PostgreSQL types a bound parameter
    in a CASE as text unless told (Django's bulk_update casts for the same reason)."""
    if not connection.features.requires_casted_case_in_updates:
        return "%s"
    return f"CAST(%s AS {_CASE_TYPES[column].db_type(connection)})"
