"""``queue_delivery_state``: one consumer group's delivery of one message. Its manager is
composed of the table's reads (:mod:`.delivery_reads`) and writes (:mod:`.delivery_writes`)."""

from __future__ import annotations

from django.db import models

from .delivery_reads import DeliveryReads
from .delivery_rows import NEVER_DELIVERED, CancelView, DeliveryRow, Hold, MessageRef, ReadRow
from .delivery_writes import DeliveryWrites
from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH

__all__ = ["NEVER_DELIVERED", "CancelView", "DeliveryRow", "DeliveryState", "DeliveryStateManager", "Hold",
           "MessageRef", "ReadRow"]


class DeliveryStateManager(DeliveryReads, DeliveryWrites):
    """SQL for ``queue_delivery_state``: read a group's view of the log, deliver, hold, ack,
    nack, extend, clean up.

    The worker calls these inside its poll transaction, after it has share-locked its own
    lease rows: that lock is the fence that keeps a worker which lost a partition from
    writing on its behalf.
    """


class DeliveryState(models.Model):
    """One consumer group's delivery of one message (the RFC's ``queue_delivery_state``).

    Beyond the RFC: ``last_error`` keeps the handler's most recent failure so the DLQ copy
    (and an operator) can see why a message is being retried; ``retry_count`` is -1 for a
    message the group's worker has read but not delivered yet (delayed, or waiting behind
    an earlier message of its key in strict mode).
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key", "message_offset")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    message_offset = models.BigIntegerField()
    acked = models.BooleanField(default=False)
    # Epoch ms (database clock); only meaningful while acked is false.
    invisible_until = models.BigIntegerField(default=0)
    # Redeliveries so far: the attempt number is retry_count + 1 (-1: not delivered yet).
    retry_count = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Waiting messages the watermark has passed (see django_sqlqueue.models.waiting):
    # NOT_PARKED, PARKED_DUE or PARKED_BEHIND. A parked row also names its message's key and
    # position, so a key's next parked message is found without reading the log.
    parked = models.SmallIntegerField(db_default=0)
    message_key = models.CharField(max_length=KEY_LENGTH, blank=True, db_default="")
    message_position = models.BigIntegerField(db_default=0)
    # The latest delivery was handed to a handler and has reported no outcome yet (running,
    # or queued for a thread, however long its visibility has run out): what tells a
    # cancellation "already running" from a retry waiting out its backoff, whose rows
    # otherwise look alike.
    in_flight = models.BooleanField(db_default=False)

    objects = DeliveryStateManager()

    class Meta:
        db_table = "queue_delivery_state"
        verbose_name = "delivery state"
        verbose_name_plural = "delivery states"
        # Both lead with a column the joins on this table (message → delivery row) never
        # name, so no planner takes them for the primary key: PostgreSQL with stale
        # statistics once read a whole group's rows per message through such a prefix.
        indexes = [
            # A partition's parked messages by due time (and, acked, those GC may collect).
            models.Index(fields=["parked", "consumer_group", "topic", "partition_key", "acked",
                                 "invisible_until"], name="queue_delivery_parked"),
            # A key's parked messages in log order (strict mode); the partition is left out
            # to fit MySQL's index size limit (a key lives in one partition).
            models.Index(fields=["message_key", "consumer_group", "topic", "message_position"],
                         name="queue_delivery_parked_key"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key}@{self.message_offset}"
