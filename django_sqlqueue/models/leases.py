from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db import connections, models, transaction

from ..db import sql as sqlb
from ..db import vendor
from ..db.liveness import dead_holder_sql
from .fields import GROUP_LENGTH, KEY_LENGTH, SUBSCRIBER_NAME_LENGTH, TOPIC_LENGTH
from .partitioned import PartitionRowsManager

# (consumer_group, topic, partition_key) -> generation
Owned = dict[tuple[str, str, str], int]


class Fenced(NamedTuple):
    """What a fence read: the partitions still this worker's (with their generations),
    every partition whose row was read, and each one's count of cancellations."""

    owned: Owned
    seen: set[tuple[str, str, str]]
    cancellations: dict[tuple[str, str, str], int]


class PartitionLeaseManager(PartitionRowsManager):
    """SQL for ``queue_partition_leases``: create, acquire, renew, fence, release."""

    def fence(self, worker: str, token: str, held: Sequence[tuple[str, str, str]],
              using: str, *, commit_async: bool = False) -> Fenced:
        """Share-lock the lease rows of ``held`` partitions; return those still leased to
        this worker process (its name and token), with their generations, every
        partition whose row was read, and each one's count of cancellations.

        Run first in a transaction: until it commits nobody can take these partitions, so
        every later statement in it writes only on behalf of partitions still owned. The
        rows are found by primary key, the order in which lease takers lock them too, so
        fencing and taking cannot deadlock. A row another transaction holds (an operator's
        ``repartition`` deleting it, a worker taking it over) is passed over, not waited
        for: that partition sits this cycle out, and the others go on.

        ``commit_async`` (PostgreSQL): the transaction will commit without waiting for its
        WAL flush, set in this statement so that it costs no round trip of its own (see
        docs/consuming.md, "What a database crash can undo").
        """
        if not held:
            return Fenced({}, set(), {})
        connection = connections[using]
        q = sqlb.quoter(connection)
        by_subscription: dict[tuple[str, str], list[str]] = {}
        for group, topic, key in held:
            by_subscription.setdefault((group, topic), []).append(key)
        owned: Owned = {}
        seen: set[tuple[str, str, str]] = set()
        cancellations: dict[tuple[str, str, str], int] = {}
        asynchronous = (", set_config('synchronous_commit', 'off', true)"
                        if commit_async and connection.vendor == "postgresql" else "")
        for (group, topic), keys in by_subscription.items():
            for batch in sqlb.chunks(keys, 1000):
                rows = sqlb.fetch_all(
                    connection,
                    f"SELECT {q('partition_key')}, {q('leased_by')}, {q('lease_token')}, "  # noqa: S608 - names quoted, values bound
                    f"{q('generation')}, {q('cancellations')}{asynchronous} "
                    f"FROM {sqlb.locked_table(connection, 'queue_partition_leases')} "
                    f"WHERE {q('consumer_group')} = %s "
                    f"AND {q('topic')} = %s AND {q('partition_key')} IN "
                    f"({sqlb.placeholders(len(batch))})"
                    + vendor.for_share_sql(connection, skip_locked=True),
                    [group, topic, *batch],
                )
                seen.update((group, topic, r[0]) for r in rows)
                owned.update(
                    {(group, topic, r[0]): int(r[3]) for r in rows
                     if r[1] == worker and r[2] == token}
                )
                cancellations.update({(group, topic, r[0]): int(r[4]) for r in rows})
        return Fenced(owned, seen, cancellations)

    def lock_for_cancel(self, group: str, topic: str, partition: str, using: str) -> bool:
        """Lock one lease row for a cancellation; False when the row does not exist.

        The lock waits for the owner's poll cycle to commit (it share-locks the row), so
        the cancellation sees what that cycle handed out, and the owner's next cycle waits
        for the cancellation. SQLite has no row locks: an update that changes nothing takes
        the database's write lock, which orders the two the same way."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        where = (f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
                 f"AND {q('partition_key')} = %s")
        if connection.vendor == "sqlite":
            return sqlb.execute(
                connection,
                f"UPDATE {q('queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
                f"SET {q('cancellations')} = {q('cancellations')} {where}",
                [group, topic, partition],
            ) > 0
        return bool(sqlb.fetch_all(
            connection,
            f"SELECT 1 FROM {sqlb.locked_table(connection, 'queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
            f"{where}{vendor.for_update_sql(connection)}",
            [group, topic, partition],
        ))

    def note_cancellation(self, group: str, topic: str, partition: str, using: str) -> None:
        """Bump the row's count of cancellations (the caller holds it locked): the owner's
        next fence reads it and rebuilds its window without the cancelled message."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('cancellations')} = {q('cancellations')} + 1 "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s AND {q('partition_key')} = %s",
            [group, topic, partition],
        )

    def groups_of_partition(self, topic: str, partition: str, using: str) -> list[str]:
        """The consumer groups with a lease row for the partition (worker groups; a Spark
        stream has none), in key order."""
        return sorted(self.using(using).filter(topic=topic, partition_key=partition)
                      .values_list("consumer_group", flat=True))

    def ensure_partitions(self, group: str, topic: str, partitions: Sequence[str],
                          using: str) -> None:
        """Create free lease rows for partitions that have none yet."""
        if partitions:
            sqlb.insert_missing_partitions(
                connections[using], "queue_partition_leases", group, topic, partitions,
                {"leased_by": "''", "leased_at": "0", "lease_renewed_at": "0", "generation": "0"},
            )

    def claimable(self, group: str, topic: str, stale_before_ms: int, limit: int,
                  using: str, judge_liveness: bool = False) -> list[str]:
        """Lock up to ``limit`` free or stale partitions (in a transaction), key order.
        ``judge_liveness``: also those whose holder's liveness lock nobody holds."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        return [r[0] for r in sqlb.fetch_all(
            connection,
            f"SELECT {q('partition_key')} FROM {q('queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {_claimable_sql(connection, judge_liveness)} "
            f"ORDER BY {q('partition_key')} LIMIT %s" + vendor.skip_locked_sql(connection),
            [group, topic, stale_before_ms, limit],
        )]

    def take(self, group: str, topic: str, keys: Sequence[str], worker: str, token: str,
             stale_before_ms: int, now_ms: int, using: str, *, judge_liveness: bool = False,
             liveness_token: str = "") -> None:
        """Take over locked, claimable partitions; a new generation fences the old owner,
        whether its lease expired or its process is gone (``judge_liveness``, see
        :meth:`claimable`). ``liveness_token``: the taker's own, while it holds its lock."""
        if not keys:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('leased_by')} = %s, {q('lease_token')} = %s, "
            f"{q('leased_at')} = %s, {q('lease_renewed_at')} = %s, "
            f"{q('generation')} = {q('generation')} + 1, {q('liveness_token')} = %s "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} IN ({sqlb.placeholders(len(keys))}) "
            f"AND {_claimable_sql(connection, judge_liveness)}",
            [worker[:SUBSCRIBER_NAME_LENGTH], token, now_ms, now_ms, liveness_token, group,
             topic, *keys, stale_before_ms],
        )

    def owned(self, group: str, topic: str, worker: str, token: str,
              using: str) -> dict[str, int]:
        """The partitions this worker process holds, with their generations."""
        return dict(
            self.using(using)
            .filter(consumer_group=group, topic=topic, leased_by=worker, lease_token=token)
            .values_list("partition_key", "generation")
        )

    def owned_by(self, worker: str, token: str, using: str
                 ) -> dict[tuple[str, str], dict[str, int]]:
        """:meth:`owned` for every (group, topic) at once: one query per renewal, however
        many subscriptions the worker runs."""
        owned: dict[tuple[str, str], dict[str, int]] = {}
        rows = (self.using(using).filter(leased_by=worker, lease_token=token)
                .values_list("consumer_group", "topic", "partition_key", "generation"))
        for group, topic, partition, generation in rows:
            owned.setdefault((group, topic), {})[partition] = generation
        return owned

    def adopt(self, group: str, topic: str, keys: Sequence[str], worker: str, token: str,
              using: str, liveness_token: str = "") -> int:
        """Start a new generation of leases this process holds but did not know it held
        (a take whose follow-up read failed): nothing delivered under the old generation
        may be acked or extended under the new one."""
        if not keys:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('generation')} = {q('generation')} + 1, {q('liveness_token')} = %s "
            f"WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('partition_key')} IN ({sqlb.placeholders(len(keys))}) "
            f"AND {q('leased_by')} = %s AND {q('lease_token')} = %s",
            [liveness_token, group, topic, *keys, worker, token],
        )

    def renew(self, worker: str, token: str, now_ms: int, using: str,
              liveness_token: str = "") -> set[tuple[str, str, str]]:
        """Renew every lease this worker process holds and no other transaction locks;
        return the (group, topic, partition) of those renewed.

        The token matters: a paused process and its replacement may share a name, and
        the replacement must not keep the paused one's leases alive. A row held by
        another transaction (an operator's ``repartition`` deleting it, say) is passed
        over, so that one held row never stops the renewal of the others: the rows are
        found with a plain read, then locked by primary key skipping held ones (InnoDB
        waits for a row held elsewhere when it reaches it through another index), and
        only those are updated. Each renewed row gets ``liveness_token``: the worker's
        token while it holds its liveness lock, else '' (judged by the lease alone)."""
        connection = connections[using]
        q = sqlb.quoter(connection)
        mine: dict[tuple[str, str], list[str]] = {}
        for group, topic, key in sqlb.fetch_all(
            connection,
            f"SELECT {q('consumer_group')}, {q('topic')}, {q('partition_key')} "  # noqa: S608 - names quoted, values bound
            f"FROM {q('queue_partition_leases')} WHERE {q('leased_by')} = %s "
            f"AND {q('lease_token')} = %s",
            [worker, token],
        ):
            mine.setdefault((group, topic), []).append(key)
        renewed: set[tuple[str, str, str]] = set()
        rows = [(group, topic, key) for (group, topic), keys in mine.items() for key in keys]
        with transaction.atomic(using=using):
            # Every subscription's rows in one statement per 500: a renewal costs the same
            # whatever the number of subscriptions. Each (group, topic) term is a range of
            # the primary key.
            for batch in sqlb.chunks(rows, 500):
                where, params = _rows_where(connection, batch)
                owner = f"{q('leased_by')} = %s AND {q('lease_token')} = %s"
                locked = [(str(r[0]), str(r[1]), str(r[2])) for r in sqlb.fetch_all(
                    connection,
                    f"SELECT {q('consumer_group')}, {q('topic')}, {q('partition_key')} "  # noqa: S608 - names quoted, values bound
                    f"FROM {sqlb.locked_table(connection, 'queue_partition_leases')} "
                    f"WHERE ({where}) AND {owner}" + vendor.skip_locked_sql(connection),
                    [*params, worker, token],
                )]
                if not locked:
                    continue
                where, params = _rows_where(connection, locked)
                sqlb.execute(
                    connection,
                    f"UPDATE {sqlb.locked_table(connection, 'queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
                    f"SET {q('lease_renewed_at')} = %s, {q('liveness_token')} = %s "
                    f"WHERE ({where}) AND {owner}",
                    [now_ms, liveness_token, *params, worker, token],
                )
                renewed.update(locked)
        return renewed

    def release(self, group: str, topic: str, held: dict[str, int], worker: str, token: str,
                using: str) -> int:
        """Free partitions (only those still held under the given generations)."""
        if not held:
            return 0
        connection = connections[using]
        q = sqlb.quoter(connection)
        return sqlb.execute(
            connection,
            f"UPDATE {sqlb.locked_table(connection, 'queue_partition_leases')} "  # noqa: S608 - names quoted, values bound
            f"SET {q('leased_by')} = '', {q('lease_token')} = '', {q('liveness_token')} = '', "
            f"{q('lease_renewed_at')} = 0 WHERE {q('consumer_group')} = %s AND {q('topic')} = %s "
            f"AND {q('leased_by')} = %s AND {q('lease_token')} = %s "
            f"AND ({q('partition_key')}, {q('generation')}) IN "
            f"({sqlb.row_values(len(held), 2)})",
            [group, topic, worker, token, *[v for item in held.items() for v in item]],
        )


class PartitionLease(models.Model):
    """Which worker consumes a partition for a consumer group (``queue_partition_leases``).

    Beyond the RFC: ``generation`` is a fencing token, incremented whenever a worker takes
    (or adopts) the lease, and ``lease_token`` names the worker *process* holding it: a
    random value each process draws at start, so a process paused past its lease and a
    replacement started under the same ``--name`` are never taken for one owner. Every
    write a worker makes on the partition's behalf is fenced by them: either in the same
    transaction, after share-locking the worker's lease rows and checking token and
    generation (the poll cycle), or in the same statement (a handler's own visibility
    extension). A worker that was paused past its lease therefore cannot ack, deliver or
    move the watermark of a partition someone else owns, whatever its name.
    An empty ``leased_by`` means the partition is free.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    leased_by = models.CharField(max_length=SUBSCRIBER_NAME_LENGTH, blank=True, default="")
    leased_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    lease_renewed_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    generation = models.BigIntegerField(default=0)
    lease_token = models.CharField(max_length=32, blank=True, db_default="")
    # The holder's token again when its process holds a liveness lock named after it
    # (see django_sqlqueue.db.liveness): once no session holds that lock, the holder is
    # gone and the lease may be taken at once. Empty: judged by the lease alone.
    liveness_token = models.CharField(max_length=32, blank=True, db_default="")
    # Bumped by every cancellation of a message of the partition, under this row's lock:
    # the owner reads it with its fence and rebuilds its window when it moved.
    cancellations = models.BigIntegerField(db_default=0)

    objects = PartitionLeaseManager()

    class Meta:
        db_table = "queue_partition_leases"
        verbose_name = "partition lease"
        verbose_name_plural = "partition leases"
        indexes = [
            models.Index(fields=["leased_by"], name="queue_lease_owner"),
            models.Index(fields=["lease_renewed_at"], name="queue_lease_renewed"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key} -> {self.leased_by or '-'}"


def _claimable_sql(connection: Any, judge_liveness: bool) -> str:
    """The condition of a lease another worker may take (one ``%s``: stale before, ms):
    free, expired, or (``judge_liveness``) held by a process whose liveness lock nobody
    holds any more. Taking it is the same either way: a new generation fences the old
    holder."""
    q = sqlb.quoter(connection)
    dead = (" OR " + dead_holder_sql(connection, q("liveness_token"), q("lease_token"))
            if judge_liveness else "")
    return f"({q('leased_by')} = '' OR {q('lease_renewed_at')} < %s{dead})"


def _rows_where(connection: Any, rows: Sequence[tuple[str, str, str]]) -> tuple[str, list[str]]:
    """SQL matching lease rows by primary key: one term per (group, topic), each a range
    of the key, in key order."""
    q = sqlb.quoter(connection)
    by_topic: dict[tuple[str, str], list[str]] = {}
    for group, topic, key in sorted(rows):
        by_topic.setdefault((group, topic), []).append(key)
    terms, params = [], []
    for (group, topic), keys in by_topic.items():
        terms.append(f"({q('consumer_group')} = %s AND {q('topic')} = %s "
                     f"AND {q('partition_key')} IN ({sqlb.placeholders(len(keys))}))")
        params += [group, topic, *keys]
    return " OR ".join(terms), params
