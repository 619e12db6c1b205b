"""Checks shared by the operations: names and registered (group, topic) pairs."""

from __future__ import annotations

import re
from typing import Any

from django.db import connections

from ..db import vendor
from ..models import ConsumerOffset
from ..models.fields import GROUP_LENGTH, TOPIC_LENGTH
from .errors import UnknownSubscription

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")  # what @subscriber and publish() accept


def check_name(kind: str, name: Any) -> str:
    """``name`` if it can be a group or topic name, else UnknownSubscription."""
    limit = GROUP_LENGTH if kind == "consumer group" else TOPIC_LENGTH
    if not isinstance(name, str) or len(name) > limit or not _NAME_RE.fullmatch(name):
        raise UnknownSubscription(
            f"{name!r} is not a {kind} name (up to {limit} letters, digits, '.', '_' and '-')")
    return name


def require_registered(group: str, topic: str, using: str) -> None:
    """Refuse a (group, topic) no worker ever registered (it has no watermark rows)."""
    check_name("consumer group", group)
    check_name("topic", topic)
    if not ConsumerOffset.objects.using(using).filter(consumer_group=group, topic=topic).exists():
        known = sorted(ConsumerOffset.objects.using(using).filter(topic=topic)
                       .values_list("consumer_group", flat=True).distinct())
        hint = f"; groups of {topic!r}: {', '.join(known)}" if known else (
            f"; topic {topic!r} has no registered consumer group")
        raise UnknownSubscription(f"consumer group {group!r} is not registered for topic "
                                  f"{topic!r}{hint}")


def database_now_ms(using: str) -> int:
    """The database clock, in epoch ms: every queue time is on it."""
    return vendor.database_now_ms(connections[using])
