"""A message as it is stored: validation and JSON encoding, one implementation for
publish() and for the Spark writer.

Pure Python with no Django settings (it runs on Spark executors too): the payload limit
is passed in by the caller, who reads it from ``SQLQUEUE`` or from an option.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal
from itertools import accumulate
from typing import Any, NamedTuple

from django.core.serializers.json import DjangoJSONEncoder

from .exceptions import InvalidMessage
from .limits import ID_LENGTH, KEY_LENGTH, MAX_PAYLOAD_DEPTH, MAX_TOPIC_LENGTH
from .replays import RESERVED_PREFIX


class NewRow(NamedTuple):
    """A validated message on its way into the log.

    ``id_given`` is False for an id generated at publish (a new UUID), which cannot be in
    the log already.
    """

    topic: str
    key: str
    id: str
    payload_json: str
    headers_json: str
    delay_ms: int
    id_given: bool = True


TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")  # the whole name: use fullmatch
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
ROW_OVERHEAD_BYTES = 512  # SQL text per row (the clock expressions) and quoting

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


# Measuring the nesting of JSON text without decoding it (which recurses): each bracket
# steps the depth up or down. Brackets inside strings count too at first, an upper bound
# that settles almost every payload; only one over the limit is measured again without
# its strings.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_ALL_BUT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(text: str | bytes | bytearray) -> int:
    """How many levels of arrays and objects nest in the JSON text ``text`` (0 for a
    scalar), counted without recursion, so any depth is measured safely."""
    if isinstance(text, bytes | bytearray):
        # Brackets, quotes and backslashes are ASCII, and no byte of a multi-byte UTF-8
        # character is: latin-1 keeps every one of them where it is.
        text = bytes(text).decode("latin-1")
    # Without an escaped quote, every quote opens or closes a string: split on them.
    bare = _JSON_STRING.sub("", text) if '\\"' in text else "".join(text.split('"')[::2])
    return _bracket_depth(bare)


def _bracket_depth(text: str) -> int:
    """The deepest nesting of the brackets in ``text``, strings or not."""
    brackets = text.encode("utf-8", "surrogatepass").translate(None, _ALL_BUT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def too_deep(text: str | bytes | bytearray) -> int | None:
    """The nesting of JSON text ``text`` when it is deeper than MAX_PAYLOAD_DEPTH, else
    None. Cheap for the usual payload: one with fewer brackets than the limit is not
    measured at all."""
    if isinstance(text, bytes | bytearray):
        opening = text.count(b"[") + text.count(b"{")
    else:
        opening = text.count("[") + text.count("{")
    if opening <= MAX_PAYLOAD_DEPTH:
        return None
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("latin-1")
    if _bracket_depth(text) <= MAX_PAYLOAD_DEPTH:
        return None
    depth = json_depth(text)
    return depth if depth > MAX_PAYLOAD_DEPTH else None


def depth_error(what: str, depth: int) -> str:
    """Why a payload (or headers) nested ``depth`` levels is refused."""
    return (f"{what} nested too deeply: {depth} levels of arrays and objects, over the limit "
            f"of {MAX_PAYLOAD_DEPTH} (MAX_PAYLOAD_DEPTH)")


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


def build_row(
    topic: str, payload: Any, key: Any, message_id: Any, headers: Any, delay: Any, max_bytes: int
) -> NewRow:
    """Validate one message and encode it as publish() stores it; raise InvalidMessage."""
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
        raise InvalidMessage(depth_error("payload is", _nesting(payload))) from exc
    if "e+" in text:
        text = _STRING_OR_BIG_FLOAT.sub(_spell_out_float, text)
    depth = too_deep(text)
    if depth is not None:
        raise InvalidMessage(depth_error("payload is", depth))
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


def _nesting(value: Any) -> int:
    """How deeply ``value``'s lists, tuples and dicts nest, walked without recursion (each
    container once: a payload can refer to itself)."""
    deepest = 0
    seen: set[int] = set()
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


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
        if name.lower().startswith(RESERVED_PREFIX):
            # Workers act on these (a replay's group makes every other group pass over the
            # message), so only the queue writes them: replays are built in the database
            # from the dead-letter row (store.dead_letters.insert_replays), never here.
            raise InvalidMessage(
                f"header {name!r} is reserved: names starting with {RESERVED_PREFIX!r} are "
                "set by the queue itself; use another name")
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
