"""Turning ``manage.py sqlqueue`` options into validated values, one readable line on error."""

from __future__ import annotations

import math
import re
from typing import Any

from django.core.management.base import CommandError

from django_sqlqueue.operations import DeadLetterFilter, OperationError

USAGE_ERROR = 2
_AGE_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_AGE_SECONDS = 10 * 365 * 86400  # ten years: anything longer is a typo


def positive_seconds(option: str, value: Any) -> float:
    """``value`` as seconds: a number, or a number with s, m, h or d (``90m``, ``7d``)."""
    text = str(value).strip()
    match = _AGE_RE.fullmatch(text) if text.isascii() else None
    seconds = float(match.group(1)) * _UNITS[match.group(2)] if match else math.nan
    if not 0 <= seconds <= MAX_AGE_SECONDS:
        raise CommandError(f"{option} must be seconds, or a number with s, m, h or d "
                           f"(e.g. 90, 30m, 7d), got {text!r}", returncode=USAGE_ERROR)
    return seconds


def dead_letter_filter(options: dict[str, Any]) -> DeadLetterFilter:
    """The DeadLetterFilter the --id/--topic/--group/--older-than/--error-contains options
    describe."""
    ids = []
    for value in options["id"]:
        text = str(value).strip()
        if not (text.isascii() and text.isdecimal() and int(text) > 0):
            raise CommandError(f"--id must be a dead letter's id (a positive whole number), "
                               f"got {text!r}", returncode=USAGE_ERROR)
        ids.append(int(text))
    older = options["older_than"]
    error = options["error_contains"]
    if error is not None and not error.isprintable():
        raise CommandError(f"--error-contains must be printable text, got {error!r}",
                           returncode=USAGE_ERROR)
    flt = DeadLetterFilter(
        ids=tuple(ids), topic=options["topic"], group=options["group"],
        older_than=None if older is None else positive_seconds("--older-than", older),
        error_contains=error,
    )
    try:
        flt.validate()
    except OperationError as exc:
        raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
    return flt
