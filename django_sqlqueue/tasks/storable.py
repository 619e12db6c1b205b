"""A task's outcome in a form every database stores, saying what had to be dropped.

A return value or an error the database refuses (a NUL character on PostgreSQL, a
statement over ``max_allowed_packet`` on MariaDB) would fail the poll cycle recording it,
again at every try, and the task would run again. So before a result is recorded:

* a return value whose text holds NUL characters or lone surrogates is kept with those
  written out as escapes (``\\x00``), wrapped in a marker saying so;
* a return value whose JSON is over ``SQLQUEUE["MAX_PAYLOAD_BYTES"]`` (the size of the
  biggest message) is replaced by a marker giving its type and size;
* an error's traceback is scrubbed the same way and cut to ERROR_LENGTH characters,
  keeping its start and its end.

A marker is an object ``{"sqlqueue_unstorable": "<what was done and why>", ...}``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..conf import get_settings
from ..limits import ERROR_LENGTH, storable_error

MARKER = "sqlqueue_unstorable"  # the key of the object that stands for an unstorable value
# In JSON text from an ensure_ascii encoder (Django's JSONField writes one), NUL and
# surrogates appear only as escapes.
_SUSPECT = re.compile(r"\\u0000|\\ud[89a-f]", re.IGNORECASE)


def storable_return_value(value: Any, text: str) -> tuple[Any, int]:
    """``value`` (a JSON value; ``text``: its JSON) as the result row stores it, and the
    size of that in bytes of JSON."""
    size = len(text)
    if _SUSPECT.search(text):
        scrubbed = _scrub(value)
        if scrubbed != value:  # a pair of surrogates is one character, and fine
            value = {MARKER: "the return value had NUL characters or lone surrogates, which "
                             "cannot be stored; they are written out as escapes (\\x00) in "
                             "'value'", "value": scrubbed}
            text = json.dumps(value)
            size = len(text)
    limit = get_settings().max_payload_bytes
    if size > limit:
        kind = type(value.get("value") if _is_marker(value) else value).__name__
        value = {MARKER: f"the return value ({kind}, {size:,} bytes as JSON) is over the "
                         f"{limit:,}-byte limit of SQLQUEUE['MAX_PAYLOAD_BYTES']; it was "
                         "not stored", "type": kind, "bytes": size}
        size = len(json.dumps(value))
    return value, size


def storable_traceback(text: str) -> str:
    """A traceback as the result row stores it: its start and its end, escaped."""
    return storable_error(text, ERROR_LENGTH, keep_end=True)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return storable_error(value, None)
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    if isinstance(value, dict):
        return {storable_error(key, None) if isinstance(key, str) else key: _scrub(item)
                for key, item in value.items()}
    return value


def _is_marker(value: Any) -> bool:
    return isinstance(value, dict) and MARKER in value
