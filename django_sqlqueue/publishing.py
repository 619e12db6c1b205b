"""publish() and publish_many(): validate, then append to the log on the caller's connection.

The INSERT runs on the caller's connection and inside the caller's transaction, so a
message exists only if the surrounding ``transaction.atomic`` block commits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from .conf import get_settings, queue_database
from .db import notify
from .encoding import PUBLISH_BATCH_BYTES, ROW_OVERHEAD_BYTES, NewRow, build_row, validate_topic
from .exceptions import InvalidMessage
from .models import QueueMessage
from .models.messages import MessageRow
from .rows import decode_json, epoch_ms_to_datetime

_MESSAGE_FIELDS = frozenset({"payload", "key", "id", "headers", "delay"})

Observer = Callable[[Sequence["StoredMessage"]], None]
# Told what every publish() writes (see observe()); replaced whole under the lock, so a
# publish reads it without one and an observer added meanwhile waits for the next publish.
_observers: tuple[Observer, ...] = ()
_observers_lock = threading.Lock()


class StoredMessage:
    """A message as stored in the log, returned by publish() and publish_many().

    Read-only. ``payload`` and ``headers`` are decoded from the stored JSON the first time
    they are read: most callers ignore what publish() returns, and decoding is a large
    share of the cost of a single publish().
    """

    __slots__ = ("offset", "topic", "key", "id", "published_at", "deliver_at",
                 "_payload_json", "_headers_json", "_decoded", "written")

    offset: int
    topic: str
    key: str
    id: str
    published_at: datetime
    deliver_at: datetime
    _payload_json: Any  # JSON text or already decoded, as the backend returns it
    _headers_json: Any
    _decoded: tuple[Any, dict[str, str]] | None
    # False when the publish that returned it wrote nothing: a message with its (topic,
    # key, id) was stored already, and this is that message (its payload, its offset).
    written: bool

    def __init__(self, row: MessageRow, written: bool = True) -> None:
        set_ = object.__setattr__
        set_(self, "written", written)
        set_(self, "offset", row.offset)
        set_(self, "topic", row.topic)
        set_(self, "key", row.key)
        set_(self, "id", row.id)
        set_(self, "published_at", epoch_ms_to_datetime(row.published_at))
        set_(self, "deliver_at", epoch_ms_to_datetime(row.deliver_at))
        set_(self, "_payload_json", row.payload)
        set_(self, "_headers_json", row.metadata)
        set_(self, "_decoded", None)

    @classmethod
    def from_row(cls, row: MessageRow, written: bool = True) -> StoredMessage:
        return cls(row, written)

    @property
    def payload(self) -> Any:
        return self._decode()[0]

    @property
    def headers(self) -> dict[str, str]:
        return self._decode()[1]

    def _decode(self) -> tuple[Any, dict[str, str]]:
        decoded = self._decoded
        if decoded is None:
            headers: dict[str, str] = decode_json(self._headers_json) or {}
            decoded = (decode_json(self._payload_json), headers)
            object.__setattr__(self, "_decoded", decoded)
        return decoded

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"StoredMessage is read-only; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"StoredMessage is read-only; cannot delete {name!r}")

    def _fields(self) -> tuple[Any, ...]:
        return (self.offset, self.topic, self.key, self.id, self.payload, self.headers,
                self.published_at, self.deliver_at)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredMessage):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # the payload may be a dict

    def __repr__(self) -> str:
        return (f"StoredMessage(offset={self.offset!r}, topic={self.topic!r}, key={self.key!r}, "
                f"id={self.id!r}, payload={self.payload!r}, headers={self.headers!r}, "
                f"published_at={self.published_at!r}, deliver_at={self.deliver_at!r})")


def publish(
    topic: str,
    payload: Any,
    *,
    key: str = "",
    id: str | None = None,  # noqa: A002 - the public name of the idempotency id
    headers: Mapping[str, str] | None = None,
    delay: float | timedelta | None = None,
    using: str | None = None,
) -> StoredMessage:
    """Append one message to ``topic``; publishing the same (topic, key, id) again is a no-op.

    Inside ``transaction.atomic(using=...)`` the message commits or rolls back with the block.
    """
    validate_topic(topic)
    row = build_row(topic, payload, key, id, headers, delay, get_settings().max_payload_bytes)
    alias = using or queue_database(topic)
    channel = notify.statement_channel(alias, topic)
    new: set[tuple[str, str, str]] = set()
    stored = QueueMessage.objects.insert_rows([row], using=alias, notify_channel=channel,
                                              new=new)
    if channel is None:
        notify.announce([topic], alias)
    ident = (row.topic, row.key, row.id)
    return _observed([StoredMessage.from_row(stored[ident], ident in new)])[0]


def publish_new(
    topic: str, payload: Any, *, id: str, delay: float | None = None,  # noqa: A002
    using: str | None = None,
) -> StoredMessage:
    """publish() of a keyless message under an ``id`` the caller just made up (a new UUID),
    which therefore cannot be in the log yet: the duplicate check is skipped. The Tasks
    backend uses it, since the task's id is in its payload too."""
    validate_topic(topic)
    row = build_row(topic, payload, "", id, None, delay, get_settings().max_payload_bytes)
    row = row._replace(id_given=False)
    alias = using or queue_database(topic)
    channel = notify.statement_channel(alias, topic)
    stored = QueueMessage.objects.insert_rows([row], using=alias, notify_channel=channel)
    if channel is None:
        notify.announce([topic], alias)
    return _observed([StoredMessage.from_row(stored[(row.topic, row.key, row.id)])])[0]


def publish_many(
    topic: str, messages: Iterable[Mapping[str, Any]], *, using: str | None = None
) -> list[StoredMessage]:
    """Append many messages with one multi-row INSERT per batch; all or nothing.

    Each element is a dict with "payload" and optionally "key", "id", "headers", "delay".
    One invalid element rejects the whole call before anything is written.
    """
    validate_topic(topic)
    if isinstance(messages, Mapping) or not isinstance(messages, Iterable):
        raise InvalidMessage(
            f"messages must be a list (or another iterable) of message dicts, got "
            f"{type(messages).__name__}; publish one message as [message] or with publish()"
        )
    conf = get_settings()
    rows: list[NewRow] = []
    for index, message in enumerate(messages):
        try:
            rows.append(_build_message_row(topic, message, conf.max_payload_bytes))
        except InvalidMessage as exc:
            raise InvalidMessage(f"messages[{index}]: {exc}") from exc
    if not rows:
        return []
    alias = using or queue_database(topic)
    # A repeated (topic, key, id) in one call is stored once, as its first occurrence,
    # matching what separate publish() calls do.
    first: dict[tuple[str, str, str], NewRow] = {}
    for row in rows:
        first.setdefault((row.topic, row.key, row.id), row)
    # Keys in order, so two calls sharing ids lock the unique index in the same order and
    # cannot deadlock each other; within a key the caller's order stands (the sort is
    # stable), because that is the order its messages will be consumed in.
    unique_rows = sorted(first.values(), key=lambda r: r.key)
    stored: dict[tuple[str, str, str], MessageRow] = {}
    new: set[tuple[str, str, str]] = set()
    with transaction.atomic(using=alias):
        for batch in _batches(unique_rows, conf.publish_batch_size, PUBLISH_BATCH_BYTES):
            stored.update(QueueMessage.objects.insert_rows(batch, using=alias, new=new))
        notify.announce([topic], alias)
    # A (topic, key, id) repeated in the call is written by its first occurrence only.
    returned = []
    for r in rows:
        ident = (r.topic, r.key, r.id)
        returned.append(StoredMessage.from_row(stored[ident], ident in new and first[ident] is r))
    return _observed(returned)


def publish_new_many(
    topic: str, messages: Sequence[tuple[Any, str]], *, delay: float | None = None,
    using: str | None = None,
) -> list[StoredMessage]:
    """publish_new() of many keyless messages, each ``(payload, id)`` under an id the
    caller just made up, in one multi-row INSERT per batch; all or nothing. The Tasks
    backend's ``enqueue_many()`` uses it."""
    validate_topic(topic)
    conf = get_settings()
    rows: list[NewRow] = []
    for index, (payload, ident) in enumerate(messages):
        try:
            row = build_row(topic, payload, "", ident, None, delay, conf.max_payload_bytes)
        except InvalidMessage as exc:
            raise InvalidMessage(f"messages[{index}]: {exc}") from exc
        rows.append(row._replace(id_given=False))
    if not rows:
        return []
    alias = using or queue_database(topic)
    stored: dict[tuple[str, str, str], MessageRow] = {}
    with transaction.atomic(using=alias):
        for batch in _batches(rows, conf.publish_batch_size, PUBLISH_BATCH_BYTES):
            stored.update(QueueMessage.objects.insert_rows(batch, using=alias))
        notify.announce([topic], alias)
    return _observed([StoredMessage.from_row(stored[(r.topic, r.key, r.id)], True)
                      for r in rows])


def observe(observer: Observer) -> Callable[[], None]:
    """Call ``observer`` with the messages each publish(), publish_many() and task
    enqueue returns from now on, in every thread, as soon as they are written (committed
    or not); return the function that stops it. ``django_sqlqueue.testing.captured`` uses
    it."""
    global _observers
    with _observers_lock:
        _observers = (*_observers, observer)

    def stop() -> None:
        global _observers
        with _observers_lock:
            _observers = tuple(o for o in _observers if o is not observer)

    return stop


def _observed(messages: list[StoredMessage]) -> list[StoredMessage]:
    for observer in _observers:
        observer(messages)
    return messages


def _batches(rows: list[NewRow], max_rows: int, max_bytes: int) -> Iterator[list[NewRow]]:
    """Consecutive runs of ``rows`` of at most ``max_rows`` rows and about ``max_bytes``
    bytes of data each; a row bigger than that alone."""
    batch: list[NewRow] = []
    size = 0
    for row in rows:
        row_size = (len(row.payload_json) + len(row.headers_json)  # ASCII JSON
                    + 4 * (len(row.key) + len(row.id)) + ROW_OVERHEAD_BYTES)
        if batch and (len(batch) == max_rows or size + row_size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += row_size
    if batch:
        yield batch


def _build_message_row(topic: str, message: Mapping[str, Any], max_bytes: int) -> NewRow:
    if not isinstance(message, Mapping):
        raise InvalidMessage(f"each message must be a dict, got {type(message).__name__}")
    unknown = set(message) - _MESSAGE_FIELDS
    if unknown:
        raise InvalidMessage(
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
            f"allowed: {', '.join(sorted(_MESSAGE_FIELDS))}"
        )
    if "payload" not in message:
        raise InvalidMessage('"payload" is required')
    return build_row(
        topic, message["payload"], message.get("key", ""), message.get("id"),
        message.get("headers"), message.get("delay"), max_bytes,
    )
