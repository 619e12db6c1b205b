"""Ending a message the poll cycle cannot handle: dead-lettered with a reason a person can
read, so the rest of its partition goes on.

A message gets here in one of two ways. Its payload or headers cannot be decoded (nested
deeper than MAX_PAYLOAD_DEPTH, or not JSON): found when it is about to be handed out, in
that cycle. Or it makes its poll cycle fail, again and again, with nothing else in it
(see :mod:`.isolation`): a cycle then dead-letters it instead of handing it out or
recording its outcome. Either way the copy is made from the log row as stored, never
from a decoded payload.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection

from ..consuming.message import Message
from ..limits import storable_error
from ..logtext import loggable
from ..models import DeliveryState, QueueMessage
from ..models.messages import DeadLetterSource, MessageRow
from ..rows import epoch_ms_to_datetime
from .partitions import Partition
from .results import CycleResult, DeadOnFetch
from .window import Entry

logger = logging.getLogger("django_sqlqueue.worker")


def bare_message(row: MessageRow, partition: Partition, attempt: int) -> Message:
    """``row`` as a Message without decoding it: the payload None and no headers (what
    the ``message_dead_lettered`` signal gets for a message that cannot be decoded)."""
    return Message(topic=row.topic, key=row.key, id=row.id, offset=row.offset, payload=None,
                   headers={}, published_at=epoch_ms_to_datetime(row.published_at),
                   attempt=attempt, group=partition.group, position=row.position or 0,
                   partition=partition.number)


def dead_letter_row(partition: Partition, row: MessageRow, entry: Entry | None, error: str,
                    result: CycleResult, dlq_suffix: str, using: str,
                    message: Message | None = None) -> None:
    """Copy ``row`` to the group's dead-letter topic with ``error`` as its reason and mark
    it done for the group, whether it was delivered before or never (its delivery row is
    written acked if it had none, so the window passes it when it is read)."""
    attempts = entry.attempts if entry is not None else 0
    if message is None:
        message = bare_message(row, partition, max(attempts, 1))
    message.attempt = attempts
    QueueMessage.objects.copy_to_dead_letters(
        _source(row), partition.topic + dlq_suffix, partition.group, attempts, error, using)
    # "Done without running it", as a cancellation writes it; ``error`` is its reason.
    DeliveryState.objects.cancel(partition.group, partition.topic,
                                 partition.ref(row.offset), storable_error(error), using)
    if entry is not None:
        partition.settled(entry)
    result.report(partition).dead_on_fetch.append(DeadOnFetch(partition, message, error))
    logger.error("dead-lettering a message its worker cannot handle group=%s topic=%s "
                 "partition=%s offset=%s error=%s", partition.group, partition.topic,
                 partition.number, row.offset, loggable(error, 300))


def dead_letter_offsets(partition: Partition, offsets: Collection[int], error: str,
                        result: CycleResult, dlq_suffix: str, using: str) -> None:
    """Dead-letter the messages ``offsets`` of ``partition``, wherever they are: in its
    window (waiting, or in flight with an outcome the cycle could not record) or not read
    yet."""
    rows = QueueMessage.objects.by_offsets(list(offsets), using)
    for offset in sorted(offsets):
        entry = partition.entries.get(offset)
        row = rows.get(offset)
        if row is None:  # collected: nothing left to end
            if entry is not None:
                partition.settled(entry)
            continue
        try:
            message: Message | None = Message.from_row(
                row, partition.group, max(entry.attempts if entry else 0, 1), partition.number)
        except Exception:  # noqa: BLE001 - the signal then gets the message undecoded
            message = None
        dead_letter_row(partition, row, entry, error, result, dlq_suffix, using, message)


def _source(row: MessageRow) -> DeadLetterSource:
    """The values the copy falls back on should GC have collected the log row: the JSON
    as stored (it may not decode)."""
    return DeadLetterSource(row.offset, row.topic, row.key, row.id, _text(row.payload),
                            _text(row.metadata), row.published_at)


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "surrogateescape")
    return json.dumps(value, separators=(",", ":"))
