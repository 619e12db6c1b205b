"""Turning ``manage.py sqlqueue`` options into validated values, one readable line on error."""

from __future__ import annotations

import math
import re
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from django_sqlqueue import operations as ops
from django_sqlqueue.conf import get_settings
from django_sqlqueue.models import ConsumerOffset, QueueMessage, Topic
from django_sqlqueue.operations import DeadLetterFilter, OperationError
from django_sqlqueue.operations.dead_letters import BATCH_SIZE as DEAD_LETTER_BATCH_SIZE

USAGE_ERROR = 2
_AGE_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_AGE_SECONDS = 10 * 365 * 86400  # ten years: anything longer is a typo
MAX_INDENT = 16  # spaces per level for stats --json --indent


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


def dead_letter_arguments(parser: ArgumentParser) -> None:
    """The options replay and discard share: which dead letters, and how."""
    # Strings, checked in handle() (see dead_letter_filter), so a bad value gets one line.
    parser.add_argument("--id", action="append", default=[], metavar="ID",
                        help="A dead letter's id (repeatable).")
    parser.add_argument("--topic", default=None, help="The topic the message was published to.")
    parser.add_argument("--group", default=None, help="The consumer group that failed it.")
    parser.add_argument("--older-than", default=None, metavar="AGE",
                        help="Dead-lettered longer ago than AGE: seconds, or 30m, 12h, 7d.")
    parser.add_argument("--error-contains", default=None, metavar="TEXT",
                        help="Its last error contains TEXT (case-insensitive).")
    parser.add_argument("--dry-run", action="store_true",
                        help="Print the count and a sample; change nothing.")
    parser.add_argument("--batch-size", default=str(DEAD_LETTER_BATCH_SIZE), metavar="N",
                        help="Dead letters per transaction (default: %(default)s).")


def json_indent(value: Any, as_json: bool) -> int | None:
    """``--indent``: spaces per level, only with ``--json``."""
    if value is None:
        return None
    text = str(value).strip()
    if not as_json:
        raise CommandError("--indent goes with --json", returncode=USAGE_ERROR)
    indent = int(text) if text.isascii() and text.isdecimal() else -1
    if not 0 <= indent <= MAX_INDENT:
        raise CommandError(f"--indent must be a whole number from 0 to {MAX_INDENT}, got {text!r}",
                           returncode=USAGE_ERROR)
    return indent


def batch_size_option(value: Any) -> int:
    """``--batch-size``: a whole number from 1 to 10,000."""
    text = str(value).strip()
    size = int(text) if text.isascii() and text.isdecimal() else 0
    if not 1 <= size <= 10_000:
        raise CommandError(f"--batch-size must be a whole number from 1 to 10000, got {text!r}",
                           returncode=USAGE_ERROR)
    return size


def refuse_dead_letter_topic(topic: str, using: str) -> None:
    """Refuse --topic naming a dead-letter topic (orders_dlq) where the original topic
    (orders) is meant: it would quietly match nothing."""
    suffix = get_settings().dlq_suffix
    base = topic[:-len(suffix)] if topic.endswith(suffix) else ""
    if not base:
        return
    dead_letters = QueueMessage.objects.using(using).filter(failed_at__gt=0)
    if dead_letters.filter(original_topic=topic).exists():
        return  # a group consumes the dead-letter topic itself and gave up on some
    if (dead_letters.filter(original_topic=base).exists()
            or Topic.objects.using(using).filter(topic=base).exists()):
        raise CommandError(
            f"--topic is the topic the messages were published to, not their dead-letter "
            f"topic: use --topic {base} (not {topic})", returncode=USAGE_ERROR)


def refuse_unknown_names(options: dict[str, Any], using: str) -> None:
    """Refuse a --topic or --group (in ``options``) the database ``using`` has never heard
    of: a typo."""
    topic, group = options.get("topic"), options.get("group")
    if topic is not None and not (
            Topic.objects.using(using).filter(topic=topic).exists()
            or ConsumerOffset.objects.using(using).filter(topic=topic).exists()
            or ops.has_messages(topic, using)):  # published, no worker has seen it yet
        raise CommandError(f"unknown topic {topic!r}", returncode=USAGE_ERROR)
    if group is not None and not (
            ConsumerOffset.objects.using(using).filter(consumer_group=group).exists()
            or QueueMessage.objects.using(using).filter(consumer_group=group).exists()):
        raise CommandError(f"unknown consumer group {group!r}", returncode=USAGE_ERROR)
