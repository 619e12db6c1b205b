"""``queue_messages``, the log, for Django code: the model, and its manager over the store's
statements (:mod:`django_sqlqueue.store.messages` and the modules beside it), run on the
alias's connection."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, models

from ..db import sql as sqlb
from ..db import vendor
from ..db.errors import check_refusal
from ..encoding import NewRow
from ..exceptions import InvalidMessage
from ..store import dead_letters, message_gc, message_reads
from ..store import messages as store_messages
from ..store.connection import django_connection
from ..store.dead_letters import DeadLetterSource, Failure
from ..store.message_reads import PartitionProgress
from ..store.messages import (
    IDEMPOTENCY_COLUMNS,
    MESSAGE_COLUMNS,
    MessageRow,
    message_row,
    select_columns,
)
from .fields import GROUP_LENGTH, ID_LENGTH, KEY_LENGTH, TOPIC_LENGTH

__all__ = ["IDEMPOTENCY_COLUMNS", "MESSAGE_COLUMNS", "DeadLetterSource", "MessageRow",
           "PartitionProgress", "QueueMessage", "QueueMessageManager", "message_row",
           "select_columns"]

_Key = tuple[str, str, str]  # (topic, key, id): what makes a message unique


def _keys(rows: Iterable[NewRow]) -> list[_Key]:
    return [(row.topic, row.key, row.id) for row in rows]


class QueueMessageManager(models.Manager["QueueMessage"]):
    """``queue_messages`` for Django code: append (publish's idempotency around the store's
    INSERT), read, dead-letter, garbage-collect.

    Reads that join the group's delivery state live with that table
    (:class:`django_sqlqueue.models.delivery.DeliveryStateManager`).
    """

    def insert_rows(self, rows: Sequence[NewRow], using: str,
                    notify_channel: str | None = None,
                    new: set[_Key] | None = None) -> dict[_Key, MessageRow]:
        """Append rows in one multi-row INSERT; a (topic, key, id) already stored keeps its row.

        ``rows`` must not repeat a (topic, key, id). Returns the stored rows by
        (topic, key, id), whether new or already there; ``new``, when given, gets the
        keys of the rows this call wrote. A duplicate is neither locked nor
        rewritten when the stored row committed before this transaction's snapshot (see
        docs/data-model.md, "Publishing the same id again"). Times come from the database
        clock, so a publisher's wrong clock cannot make a delayed message due early.
        With ``notify_channel`` the new rows notify listeners in the INSERT itself
        (PostgreSQL; see :mod:`django_sqlqueue.db.notify`).
        """
        connection = connections[using]
        conn = django_connection(using)
        stored: dict[_Key, MessageRow] = {}
        unless_stored = False
        if vendor.duplicate_check_locks(connection):
            # InnoDB's duplicate-key check share-locks the stored row's unique-index entry
            # until this transaction ends, which would hold up GC deleting that row. So rows
            # that may be stored already (published with an id) are looked for first with a
            # plain read: for one row in the INSERT itself where its SELECT reads without
            # locks (one round trip, as publish() has), else by a SELECT before it.
            if len(rows) == 1 and rows[0].id_given and vendor.insert_select_reads_unlocked(connection):
                unless_stored = True
            else:
                stored = store_messages.read_back(conn, _keys(row for row in rows if row.id_given))
                if stored:
                    rows = [row for row in rows if (row.topic, row.key, row.id) not in stored]
                    if not rows:
                        return stored
        returning = vendor.supports_returning(connection)
        try:
            written, inserted = store_messages.insert(conn, rows, returning=returning,
                                                      unless_stored=unless_stored,
                                                      notify_channel=notify_channel)
        except IntegrityError as exc:
            # The JSON check of MariaDB or SQLite refused a payload nested too deeply
            # (a one-row INSERT IGNORE still fails a CHECK constraint). Both undo just
            # the statement, so the caller's transaction goes on.
            reason = check_refusal(connection, exc)
            if reason is not None:
                raise InvalidMessage(f"the database refused the message: {reason}") from exc
            raise
        stored.update({(r.topic, r.key, r.id): r for r in inserted})
        if new is not None:
            # Without RETURNING (Oracle MySQL) a statement that skipped some rows does not
            # say which: they count as written, as publish() always reported them.
            if returning:
                new.update((r.topic, r.key, r.id) for r in inserted)
            elif written:
                new.update(_keys(rows))
        if returning and written == len(rows):
            return stored
        # Rows skipped as duplicates, or not returned (Oracle MySQL has no RETURNING). The
        # stored rows committed before this statement ran (it waited for any that were in
        # flight), so a plain read sees them.
        missing = [row for row in rows if (row.topic, row.key, row.id) not in stored]
        stored.update(store_messages.read_back(conn, _keys(missing)))
        missing = [row for row in missing if (row.topic, row.key, row.id) not in stored]
        if missing:
            # Unless this transaction reads a snapshot older than their commit (REPEATABLE
            # READ on MySQL). A locking read would see them, but it would share-lock them,
            # and the sequencer passes over locked rows: the key's later messages would be
            # positioned first. A connection of its own sees them and locks nothing.
            stored.update(self._read_back_latest(using, _keys(missing)))
        return stored

    def _read_back_latest(self, using: str, keys: Sequence[_Key]) -> dict[_Key, MessageRow]:
        """The stored rows of ``keys``, read on a new connection in autocommit, which sees
        the latest committed rows whatever the snapshot of this thread's transaction."""
        connection = connections.create_connection(using)
        try:
            return store_messages.read_back(django_connection(using, connection), keys)
        finally:
            connection.close()

    # ----------------------------------------------------------------- sequencing

    def unsequenced_count(self, cap: int, using: str) -> int:
        """Committed messages still waiting for a position, counted up to ``cap`` (the
        queue_msg_sequencing index): a backlog here means no worker is sequencing."""
        return int(self.using(using).filter(position__isnull=True)[:cap].count())

    def unsequenced_by_topic(self, cap: int, using: str) -> dict[str, tuple[int, int]]:
        """Committed messages still waiting for a position, per topic: (count, oldest
        published_at), from the first ``cap`` in the sequencer's order (the
        queue_msg_sequencing index), so the cost is bounded however large the backlog."""
        waiting: dict[str, tuple[int, int]] = {}
        rows = (self.using(using).filter(position__isnull=True).order_by("offset")
                .values_list("topic", "published_at")[:cap])
        for topic, published_at in rows:
            count, oldest = waiting.get(topic, (0, int(published_at)))
            waiting[topic] = (count + 1, min(oldest, int(published_at)))
        return waiting

    def topics(self, cap: int, using: str) -> list[str]:
        """Topics that have messages in the log, in name order, up to ``cap`` (an index
        seek per topic, not a scan of the log)."""
        return message_reads.topics(django_connection(using), cap)

    # ----------------------------------------------------------------- reading

    def partition_heads(
        self, after_position: int, up_to_position: int, topics: Sequence[str], using: str,
    ) -> list[tuple[str, str, int]]:
        """(topic, partition, highest position) of the partitions of ``topics`` that got
        messages with a position in (after, up_to]."""
        return message_reads.partition_heads(django_connection(using), after_position,
                                             up_to_position, topics)

    def by_offsets(self, offsets: Sequence[int], using: str) -> dict[int, MessageRow]:
        """Messages by offset (a redelivery needs its payload again)."""
        return message_reads.by_offsets(django_connection(using), offsets)

    def waiting_task(self, topics: Sequence[str], message_id: str, using: str | None = None
                     ) -> MessageRow | None:
        """The keyless message ``message_id`` of one of ``topics``: a task no worker has
        started (``get_result`` reads it)."""
        return message_reads.waiting_task(django_connection(using or self.db), topics,
                                          message_id)

    def offsets_between(self, topic: str, ranges: dict[str, tuple[int, int]],
                        using: str) -> list[tuple[str, int]]:
        """(partition, offset) of the messages positioned in (low, high] of each partition's
        ``(low, high)``: the ones a watermark just passed."""
        return message_reads.offsets_between(django_connection(using), topic, ranges)

    def partition_progress(self, partitions: Sequence[tuple[str, str, int]], cap: int,
                           using: str) -> dict[tuple[str, str, int], PartitionProgress]:
        """For each (topic, partition, watermark): the newest position, the messages above
        the watermark (counted up to ``cap``) and when the oldest of them was published."""
        return message_reads.partition_progress(django_connection(using), partitions, cap)

    # ----------------------------------------------------------------- dead letters

    def copy_to_dead_letters(self, original: DeadLetterSource, dlq_topic: str, group: str,
                             attempts: int, error: str, using: str) -> int:
        """Append the dead-letter copy of message ``original`` for ``group``
        (:func:`django_sqlqueue.store.dead_letters.copy`); 0 if it was there already."""
        return dead_letters.copy(django_connection(using), original, dlq_topic, group,
                                 attempts, error)

    def copy_many_to_dead_letters(self, failures: Sequence[Failure], dlq_topic: str,
                                  group: str, using: str) -> int:
        """:meth:`copy_to_dead_letters` for several messages of one topic, in one statement
        (:func:`django_sqlqueue.store.dead_letters.copy_many`)."""
        return dead_letters.copy_many(django_connection(using), failures, dlq_topic, group)

    def dead_letter_details(self, offsets: Sequence[int], using: str
                            ) -> dict[int, tuple[str, str, int, str, str, int]]:
        """Per offset of a dead-letter copy: (group, original topic, original offset,
        original id, last error, failure count)."""
        result: dict[int, tuple[str, str, int, str, str, int]] = {}
        for batch in sqlb.chunks(list(offsets), 500):
            rows = self.using(using).filter(offset__in=batch).values_list(
                "offset", "consumer_group", "original_topic", "original_offset", "original_id",
                "last_error", "failure_count")
            for offset, group, topic, original_offset, original_id, error, count in rows:
                result[int(offset)] = (group, topic, int(original_offset), original_id,
                                       error, int(count))
        return result

    # ----------------------------------------------------------------- garbage collection

    def collectable_offsets(
        self, topic: str, partition: str, after_position: int, up_to_position: int, limit: int,
        groups: Sequence[str], using: str,
    ) -> list[tuple[int, int]]:
        """(offset, position) of up to ``limit`` messages of the partition positioned in
        (after, up_to] that GC may delete (:mod:`django_sqlqueue.store.message_gc`)."""
        return message_gc.collectable_offsets(django_connection(using), topic, partition,
                                              after_position, up_to_position, limit, groups)

    def collectable_among(self, topic: str, offsets: Sequence[int], up_to_position: int,
                          groups: Sequence[str], using: str) -> list[int]:
        """Which of ``offsets`` (parked messages of one partition) GC may delete now."""
        return message_gc.collectable_among(django_connection(using), topic, offsets,
                                            up_to_position, groups)

    def delete_offsets(self, offsets: Sequence[int], using: str) -> int:
        return message_gc.delete_offsets(django_connection(using), offsets)

    # ----------------------------------------------------------------- repartitioning

    def sequenced_count(self, topic: str, using: str) -> int:
        return self.using(using).filter(topic=topic, position__isnull=False).count()

    def sequenced_offsets(self, topic: str, after: int, limit: int, using: str,
                          up_to: int | None = None) -> list[int]:
        """Offsets above ``after`` of up to ``limit`` of the topic's sequenced messages
        (positioned at ``up_to`` or below, if given), lowest first.

        Lowest first, so a transaction deleting batch after batch always holds a prefix of
        the topic's rows: a concurrent GC batch (which locks by offset too) waits for it
        instead of holding rows it needs next. ``after`` pages on by offset, which ends even
        where a snapshot still shows rows that GC has deleted meanwhile.
        """
        found = self.using(using).filter(topic=topic, position__isnull=False, offset__gt=after)
        if up_to is not None:
            found = found.filter(position__lte=up_to)
        return [int(offset) for offset in found.order_by("offset")
                .values_list("offset", flat=True)[:limit]]


class QueueMessage(models.Model):
    """The immutable message log (the RFC's ``queue_messages``), shared by all consumer groups.

    Beyond the RFC:

    * ``message_key`` is the key as published: the unit of ordering and, with ``id``, of
      idempotency. ``partition_key`` holds the message's *partition* (its number, as text),
      the unit of leasing: many keys share a partition, as in Kafka. It is set by the
      sequencer, with the topic's recorded partition count ('' until then).
    * ``position`` is the order consumers read in. ``offset`` is allocated at INSERT, but a
      publisher's transaction may commit after later offsets were read and acked (the
      commit-order gap); positions are assigned by the sequencer only to committed rows:
      in commit order across sequencing batches, in offset order within one (see
      docs/data-model.md). NULL means "committed recently, not yet sequenced".
    * ``deliver_at`` (epoch ms, database clock) is when a delayed message becomes due;
      immutable, set at publish.
    * ``consumer_group`` and ``original_offset`` are set on dead-letter copies only: which
      group gave up on the message, and which log entry it copies. Each group's failure
      makes its own copy, so one group's DLQ never hides the message from another group.
    """

    offset = models.BigAutoField(primary_key=True, db_column="offset")
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True, default="")
    message_key = models.CharField(max_length=KEY_LENGTH, blank=True, db_default="")
    message_id = models.CharField(max_length=ID_LENGTH, db_column="id")
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    metadata = models.JSONField(default=dict, blank=True)
    # Dead-letter fields: zero/empty for normal messages.
    failed_at = models.BigIntegerField(default=0)
    failure_count = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    original_topic = models.CharField(max_length=TOPIC_LENGTH, blank=True, default="")
    original_offset = models.BigIntegerField(default=0)
    consumer_group = models.CharField(max_length=GROUP_LENGTH, blank=True, default="")
    created_at = models.BigIntegerField()  # epoch ms, database clock
    published_at = models.BigIntegerField()  # epoch ms; a DLQ copy keeps the original's
    deliver_at = models.BigIntegerField()  # epoch ms; not delivered before this
    position = models.BigIntegerField(null=True, blank=True)
    # Dead-letter copies: the id the original was published with (the copy's own id is
    # "<group>:<original offset>", unique per failing group).
    original_id = models.CharField(max_length=ID_LENGTH, blank=True, db_default="")

    objects = QueueMessageManager()

    class Meta:
        db_table = "queue_messages"
        verbose_name = "message"
        verbose_name_plural = "messages"
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "message_key", "message_id"], name="queue_msg_key_idempotency"
            ),
        ]
        indexes = [
            models.Index(fields=["topic", "partition_key", "offset"], name="queue_msg_partition"),
            # Consumers read a partition in position order above their read cursor.
            models.Index(fields=["topic", "partition_key", "position"], name="queue_msg_position"),
            # The sequencer finds unsequenced rows (position IS NULL) in offset order
            # without sorting the backlog.
            models.Index(fields=["position", "offset"], name="queue_msg_sequencing"),
            # The admin's dead letters, newest first: every published message has
            # failed_at = 0, so "failed_at > 0" is a range over the dead-letter copies alone,
            # all of them or those of one original topic or one consumer group.
            models.Index(fields=["failed_at", "offset"], name="queue_msg_dead_letters"),
            models.Index(fields=["original_topic", "failed_at", "offset"],
                         name="queue_msg_dl_topic"),
            models.Index(fields=["consumer_group", "failed_at", "offset"],
                         name="queue_msg_dl_group"),
        ]
        permissions = [
            ("deliver_message", "Can make a waiting message deliverable now"),
            ("cancel_message", "Can cancel a message that has not started"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition_key}/{self.message_key}@{self.offset}"
