"""Where one message stands with each consumer group of its topic, for its detail page."""

from __future__ import annotations

from dataclasses import dataclass

from ..conf import get_settings, queue_database
from ..models import Cancellation, ConsumerOffset, DeliveryState, QueueMessage
from ..models.delivery import NEVER_DELIVERED
from .display import when


@dataclass(frozen=True)
class GroupDelivery:
    group: str
    state: str  # acked, cancelled, dead-lettered, in flight, retrying, waiting, not read yet, ...
    attempts: int | None
    invisible_until: int | None  # epoch ms
    last_error: str
    dead_letter: int | None  # offset of the group's dead-letter copy
    waiting: bool  # a delivery deliver-now can bring forward

    @property
    def invisible_until_text(self) -> str:
        return when(self.invisible_until)


def deliveries(message: QueueMessage, now_ms: int) -> list[GroupDelivery]:
    """One entry per group registered for the message's partition, in three queries."""
    using = message._state.db or queue_database()
    watermarks = dict(
        ConsumerOffset.objects.using(using)
        .filter(topic=message.topic, partition_key=message.partition_key)
        .values_list("consumer_group", "offset_acked"))
    rows = {
        row.consumer_group: row for row in DeliveryState.objects.using(using).filter(
            topic=message.topic, partition_key=message.partition_key,
            message_offset=message.offset)
    }
    # A group's dead-letter copy is "<group>:<offset>" under the message's key in the
    # dead-letter topic: the unique (topic, message_key, id) index finds it.
    groups = sorted(set(watermarks) | set(rows))
    copies = dict(
        (copy_id.split(":", 1)[0], offset) for copy_id, offset in
        QueueMessage.objects.using(using).filter(
            topic=message.topic + get_settings().dlq_suffix, message_key=message.message_key,
            message_id__in=[f"{group}:{message.offset}" for group in groups])
        .values_list("message_id", "offset")) if groups else {}
    cancelled = {c.consumer_group: c for c in Cancellation.objects.of_message(
        message.topic, message.offset, using)}
    result = []
    for group in groups:
        row = rows.get(group)
        copy = copies.get(group)
        attempts = invisible = None
        error = ""
        waiting = False
        if row is not None:
            attempts = max(0, row.retry_count + 1)
            invisible = row.invisible_until
            error = row.last_error
        if message.position is None:
            state = "not sequenced yet"
        elif copy is not None:
            state = "dead-lettered"
        elif (row is not None and row.acked) or message.position <= watermarks.get(group, 0):
            record = cancelled.get(group)
            state = "acked" if record is None else (
                f"cancelled by {record.cancelled_by or '?'} at {when(record.cancelled_at)}")
        elif row is None:
            state = "not read yet" if message.deliver_at <= now_ms else "delayed"
            waiting = message.deliver_at > now_ms
        elif row.retry_count == NEVER_DELIVERED:
            state, attempts = "waiting (delayed, or behind an earlier message of its key)", 0
            waiting = True
        elif row.invisible_until > now_ms:
            state = "retrying after a backoff" if row.last_error else "in flight"
            waiting = bool(row.last_error)
        else:
            state = "due for redelivery"
        result.append(GroupDelivery(group, state, attempts, invisible, error, copy, waiting))
    return result
