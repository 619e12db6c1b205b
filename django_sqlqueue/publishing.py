"""publish() and publish_many(): validate, then append to the log on the caller's connection.

The INSERT runs on the caller's connection and inside the caller's transaction, so a
message exists only if the surrounding ``transaction.atomic`` block commits.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import router, transaction

from .conf import get_settings
from .exceptions import InvalidMessage
from .models import QueueMessage
from .models.fields import ID_LENGTH, KEY_LENGTH, MAX_TOPIC_LENGTH
from .models.messages import MessageRow, NewRow
from .rows import decode_json, epoch_ms_to_datetime

TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")  # the whole name: use fullmatch
_MESSAGE_FIELDS = frozenset({"payload", "key", "id", "headers", "delay"})
# One encoder for every call: json.dumps(cls=...) would build a new one each time. Both
# escape every non-ASCII character (ensure_ascii), so the JSON text is ASCII.
_PAYLOAD_ENCODER = DjangoJSONEncoder(separators=(",", ":"), allow_nan=False)
_HEADERS_ENCODER = json.JSONEncoder(separators=(",", ":"))
# deliver_at (epoch ms) must stay a BIGINT and a datetime: refuse longer delays up front,
# since MySQL's INSERT IGNORE would clip an out-of-range value instead of failing.
MAX_DELAY = timedelta(days=365_250)  # 1,000 years
# Bytes of message data per INSERT in publish_many, besides PUBLISH_BATCH_SIZE rows.
# MySQL sends a statement as one packet, values escaped into its text (at most twice
# their size), and refuses one over max_allowed_packet: 16 MiB by default on MariaDB,
# 64 MiB on MySQL 8. A message bigger than this goes in an INSERT of its own.
PUBLISH_BATCH_BYTES = 4 * 1024 * 1024
_ROW_OVERHEAD_BYTES = 512  # SQL text per row (the clock expressions) and quoting

# A float that Python writes with a positive exponent (1e+16 and up) is a whole number,
# and PostgreSQL's jsonb, which keeps numbers as numeric, gives it back without the
# exponent: 1e+16 would come back as the int 10000000000000000, and 1e+308 as an int that
# is not even equal to the float. Written out with a ".0" it comes back as the same float
# on every database. The regex skips JSON strings, which can contain "e+" too.
_STRING_OR_BIG_FLOAT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?[0-9]+(?:\.[0-9]+)?e\+[0-9]+)')

# Text no database stores: NUL (PostgreSQL refuses it in text and jsonb) and UTF-16
# surrogates, which are not characters (a filename decoded with "surrogateescape" has
# them). In JSON text from an ensure_ascii encoder they appear only as escapes, so a
# substring test rules them out at C speed in the common case.
_UNSTORABLE_CHAR = re.compile(r"[\x00\ud800-\udfff]")
# The escapes to look at in JSON text: \u0000, a surrogate, and a pair of surrogates
# that make one character (an emoji, which is fine). An escaped backslash ("\\", a
# backslash in the user's text) is matched too, so that scanning stays aligned on escapes:
# a backslash followed by "u0000" in the user's text is not mistaken for a NUL.
_ESCAPE_TO_CHECK = re.compile(
    r"\\(?:\\|u(0000|d[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}|d[89a-f][0-9a-f]{2}))"
)


class StoredMessage:
    """A message as stored in the log, returned by publish() and publish_many().

    Read-only. ``payload`` and ``headers`` are decoded from the stored JSON the first time
    they are read: most callers ignore what publish() returns, and decoding is a large
    share of the cost of a single publish().
    """

    __slots__ = ("offset", "topic", "key", "id", "published_at", "deliver_at",
                 "_payload_json", "_headers_json", "_decoded")

    offset: int
    topic: str
    key: str
    id: str
    published_at: datetime
    deliver_at: datetime
    _payload_json: Any  # JSON text or already decoded, as the backend returns it
    _headers_json: Any
    _decoded: tuple[Any, dict[str, str]] | None

    def __init__(self, row: MessageRow) -> None:
        set_ = object.__setattr__
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
    def from_row(cls, row: MessageRow) -> StoredMessage:
        return cls(row)

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
    row = _build_row(topic, payload, key, id, headers, delay, get_settings().max_payload_bytes)
    alias = using or router.db_for_write(QueueMessage)
    stored = QueueMessage.objects.insert_rows([row], using=alias)
    return StoredMessage.from_row(stored[(row.topic, row.key, row.id)])


def publish_new(
    topic: str, payload: Any, *, id: str, delay: float | None = None,  # noqa: A002
    using: str | None = None,
) -> StoredMessage:
    """publish() of a keyless message under an ``id`` the caller just made up (a new UUID),
    which therefore cannot be in the log yet: the duplicate check is skipped. The Tasks
    backend uses it, since the task's id is in its payload too."""
    validate_topic(topic)
    row = _build_row(topic, payload, "", id, None, delay, get_settings().max_payload_bytes)
    row = row._replace(id_given=False)
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
        for batch in _batches(unique_rows, conf.publish_batch_size, PUBLISH_BATCH_BYTES):
            stored.update(QueueMessage.objects.insert_rows(batch, using=alias))
    return [StoredMessage.from_row(stored[(r.topic, r.key, r.id)]) for r in rows]


def _batches(rows: list[NewRow], max_rows: int, max_bytes: int) -> Iterator[list[NewRow]]:
    """Consecutive runs of ``rows`` of at most ``max_rows`` rows and about ``max_bytes``
    bytes of data each; a row bigger than that alone."""
    batch: list[NewRow] = []
    size = 0
    for row in rows:
        row_size = (len(row.payload_json) + len(row.headers_json)  # ASCII JSON
                    + 4 * (len(row.key) + len(row.id)) + _ROW_OVERHEAD_BYTES)
        if batch and (len(batch) == max_rows or size + row_size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += row_size
    if batch:
        yield batch


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
    if not TOPIC_RE.fullmatch(topic):
        bad = sorted({c for c in topic if not TOPIC_RE.fullmatch(c)})
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
    if key:
        _check_storable("key", key)
    id_given = message_id is not None
    if not id_given:
        message_id = uuid.uuid4().hex
    elif not isinstance(message_id, str):
        raise InvalidMessage(f"id must be a str, got {type(message_id).__name__}")
    elif not message_id:
        raise InvalidMessage("id must not be empty (omit it to get a new UUID)")
    elif len(message_id) > ID_LENGTH:
        raise InvalidMessage(f"id is {len(message_id)} characters long; the limit is {ID_LENGTH}")
    else:
        _check_storable("id", message_id)
    payload_json = _encode_payload(payload, max_bytes)
    headers_json = "{}" if headers is None else _encode_headers(headers, max_bytes)
    return NewRow(topic, key, message_id, payload_json, headers_json, _delay_ms(delay), id_given)


def _check_storable(field: str, text: str) -> None:
    """Refuse a NUL or a surrogate in a key or id (plain text columns)."""
    if text.isascii() and "\x00" not in text:
        return
    match = _UNSTORABLE_CHAR.search(text)
    if match:
        raise InvalidMessage(f"{field} contains {_describe(match.group())}, which cannot be stored")


def _encode_payload(payload: Any, max_bytes: int) -> str:
    try:
        text = _PAYLOAD_ENCODER.encode(payload)
    except TypeError as exc:
        raise InvalidMessage(f"payload is not JSON-serializable: {exc}") from exc
    except ValueError as exc:  # NaN/Infinity, or a circular reference
        raise InvalidMessage(f"payload is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidMessage("payload is nested too deeply to encode as JSON") from exc
    if "e+" in text:
        text = _STRING_OR_BIG_FLOAT.sub(_spell_out_float, text)
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidMessage(
            f"payload is {size} bytes as JSON, over SQLQUEUE['MAX_PAYLOAD_BYTES'] = {max_bytes}"
        )
    if "\\u0000" in text or "\\ud" in text:
        unstorable = _unstorable_escape(text)
        if unstorable is not None:
            where = _path_to_unstorable(payload, "payload") or "payload"
            raise InvalidMessage(f"{where} contains {unstorable}, which cannot be stored")
    return text


def _spell_out_float(match: re.Match[str]) -> str:
    number = match.group(1)
    if number is None:  # a JSON string: unchanged
        return match.group()
    return f"{Decimal(number):f}.0"


def _encode_headers(headers: Any, max_bytes: int) -> str:
    text = _HEADERS_ENCODER.encode(_validate_headers(headers))
    # Headers are ASCII JSON too, and limited like the payload: on MySQL an oversized
    # statement is refused by closing the connection, and the caller's transaction with it.
    if len(text) > max_bytes:
        raise InvalidMessage(
            f"headers are {len(text)} bytes as JSON, over SQLQUEUE['MAX_PAYLOAD_BYTES'] = {max_bytes}"
        )
    if "\\u0000" in text or "\\ud" in text:
        for name, value in headers.items():
            for field, part in ((f"header name {name!r}", name), (f"header {name!r}", value)):
                unstorable = _unstorable_in(part)
                if unstorable is not None:
                    raise InvalidMessage(f"{field} contains {unstorable}, which cannot be stored")
    return text


def _unstorable_escape(json_text: str) -> str | None:
    """A description of the first NUL or unpaired surrogate escaped in ``json_text``."""
    for match in _ESCAPE_TO_CHECK.finditer(json_text):
        escape = match.group(1)
        if escape is not None and len(escape) == 4:  # neither a backslash nor a pair
            return _describe(chr(int(escape, 16)))
    return None


def _describe(char: str) -> str:
    if char == "\x00":
        return "a NUL character (\\u0000)"
    return f"a lone surrogate (\\u{ord(char):04x})"


def _unstorable_in(text: str) -> str | None:
    """:func:`_unstorable_escape` of one string, encoded as publish encodes it."""
    return _unstorable_escape(_HEADERS_ENCODER.encode(text))


def _path_to_unstorable(value: Any, path: str) -> str | None:
    """Where in the payload the first unstorable string is, as ``payload["a"][0]``.

    Only called to explain an error: walking the payload is what the check on the JSON
    text saves on every publish.
    """
    if isinstance(value, str):
        return path if _unstorable_in(value) else None
    if isinstance(value, Mapping):
        for name, item in value.items():
            if isinstance(name, str) and _unstorable_in(name):
                return f"{path} key {name!r}"
            found = _path_to_unstorable(item, f"{path}[{name!r}]")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _path_to_unstorable(item, f"{path}[{index}]")
            if found:
                return found
    return None


def _validate_headers(headers: Any) -> dict[str, str]:
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
    if seconds > MAX_DELAY.total_seconds():
        raise InvalidMessage(f"delay must be at most {MAX_DELAY.days} days, got {seconds} seconds")
    return round(seconds * 1000)
