"""publish() and publish_many(): validate, then append to the log on the caller's connection.

The INSERT runs on the caller's connection and inside the caller's transaction, so a
message exists only if the surrounding ``transaction.atomic`` block commits.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import router, transaction

from .conf import get_settings
from .exceptions import InvalidMessage
from .models import QueueMessage
from .models.fields import ID_LENGTH, KEY_LENGTH, MAX_TOPIC_LENGTH
from .models.messages import MessageRow, NewRow
from .rows import common_fields, epoch_ms_to_datetime

TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_MESSAGE_FIELDS = frozenset({"payload", "key", "id", "headers", "delay"})


@dataclass(frozen=True)
class StoredMessage:
    """A message as stored in the log, returned by publish()."""

    offset: int
    topic: str
    key: str
    id: str
    payload: Any
    headers: dict[str, str]
    published_at: datetime
    deliver_at: datetime

    @classmethod
    def from_row(cls, row: MessageRow) -> StoredMessage:
        return cls(offset=row.offset, deliver_at=epoch_ms_to_datetime(row.deliver_at),
                   **common_fields(row))


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
    row = _build_row(topic, payload, key, id, headers, delay, get_settings().max_payload_bytes)
    alias = using or router.db_for_write(QueueMessage)
    stored = QueueMessage.objects.insert_rows([row], using=alias)
    return StoredMessage.from_row(stored[(row.topic, row.key, row.id)])


def publish_many(
    topic: str, messages: Iterable[Mapping[str, Any]], *, using: str | None = None
) -> list[StoredMessage]:
    """Append many messages with one multi-row INSERT per batch; all or nothing.

    Each element is a dict with "payload" and optionally "key", "id", "headers", "delay".
    One invalid element rejects the whole call before anything is written.
    """
    validate_topic(topic)
    conf = get_settings()
    rows: list[NewRow] = []
    for index, message in enumerate(messages):
        try:
            rows.append(_build_message_row(topic, message, conf.max_payload_bytes))
        except InvalidMessage as exc:
            raise InvalidMessage(f"messages[{index}]: {exc}") from exc
    if not rows:
        return []
    alias = using or router.db_for_write(QueueMessage)
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
    with transaction.atomic(using=alias):
        for start in range(0, len(unique_rows), conf.publish_batch_size):
            batch = unique_rows[start:start + conf.publish_batch_size]
            stored.update(QueueMessage.objects.insert_rows(batch, using=alias))
    return [StoredMessage.from_row(stored[(r.topic, r.key, r.id)]) for r in rows]


def validate_topic(topic: Any) -> None:
    """Raise InvalidMessage unless ``topic`` is a usable topic name."""
    if not isinstance(topic, str):
        raise InvalidMessage(f"topic must be a str, got {type(topic).__name__}")
    if not topic:
        raise InvalidMessage("topic must not be empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidMessage(
            f"topic is {len(topic)} characters long; the limit is {MAX_TOPIC_LENGTH}"
        )
    if not TOPIC_RE.match(topic):
        bad = sorted({c for c in topic if not TOPIC_RE.match(c)})
        raise InvalidMessage(
            f"topic {topic!r} contains {''.join(bad)!r}; use only letters, digits, '.', '_' and '-'"
        )


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
    return _build_row(
        topic, message["payload"], message.get("key", ""), message.get("id"),
        message.get("headers"), message.get("delay"), max_bytes,
    )


def _build_row(
    topic: str, payload: Any, key: Any, message_id: Any, headers: Any, delay: Any, max_bytes: int
) -> NewRow:
    if not isinstance(key, str):
        raise InvalidMessage(f"key must be a str, got {type(key).__name__}")
    if len(key) > KEY_LENGTH:
        raise InvalidMessage(f"key is {len(key)} characters long; the limit is {KEY_LENGTH}")
    if message_id is None:
        message_id = uuid.uuid4().hex
    elif not isinstance(message_id, str):
        raise InvalidMessage(f"id must be a str, got {type(message_id).__name__}")
    elif not message_id:
        raise InvalidMessage("id must not be empty (omit it to get a new UUID)")
    elif len(message_id) > ID_LENGTH:
        raise InvalidMessage(f"id is {len(message_id)} characters long; the limit is {ID_LENGTH}")
    payload_json = _encode_payload(payload, max_bytes)
    headers_json = json.dumps(_validate_headers(headers), separators=(",", ":"))
    return NewRow(topic, key, message_id, payload_json, headers_json, _delay_ms(delay))


def _encode_payload(payload: Any, max_bytes: int) -> str:
    try:
        text = json.dumps(payload, cls=DjangoJSONEncoder, separators=(",", ":"), allow_nan=False)
    except TypeError as exc:
        raise InvalidMessage(f"payload is not JSON-serializable: {exc}") from exc
    except ValueError as exc:  # NaN/Infinity, or a circular reference
        raise InvalidMessage(f"payload is not valid JSON: {exc}") from exc
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidMessage(
            f"payload is {size} bytes as JSON, over SQLQUEUE['MAX_PAYLOAD_BYTES'] = {max_bytes}"
        )
    return text


def _validate_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidMessage(f"headers must be a dict of str to str, got {type(headers).__name__}")
    for name, value in headers.items():
        if not isinstance(name, str):
            raise InvalidMessage(f"header names must be str, got {type(name).__name__} {name!r}")
        if not isinstance(value, str):
            raise InvalidMessage(
                f"header {name!r} must have a str value, got {type(value).__name__}"
            )
    return dict(headers)


def _delay_ms(delay: Any) -> int:
    if delay is None:
        return 0
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise InvalidMessage(
            f"delay must be seconds (int or float) or a timedelta, got {type(delay).__name__}"
        )
    if not math.isfinite(seconds):
        raise InvalidMessage(f"delay must be a finite number of seconds, got {delay!r}")
    if seconds < 0:
        raise InvalidMessage(f"delay must not be negative, got {seconds} seconds")
    return round(seconds * 1000)
