"""How the admin pages show times, ages, errors and JSON: escaped, short, readable."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

FIRST_LINE_LENGTH = 120  # characters of an error shown in a list


def from_ms(ms: int | None) -> datetime | None:
    """An epoch-millisecond column as an aware datetime (None for 0 or NULL)."""
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def when(ms: int | None) -> str:
    """Epoch milliseconds in the current time zone, to the second ('-' for none)."""
    moment = from_ms(ms)
    if moment is None:
        return "-"
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")


def age(seconds: float | None) -> str:
    """A duration the way an operator reads it: '45 s', '12 min', '3 h 5 min', '2 d 4 h'."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def first_line(text: str, limit: int = FIRST_LINE_LENGTH) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def pretty_json(value: Any) -> str:
    """JSON (decoded, or text as some backends return it) indented for reading."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def pre(text: str) -> SafeString:
    """``text`` escaped inside a <pre> block that wraps long lines."""
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)
