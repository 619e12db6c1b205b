"""The dead-letter search box: what an operator types, turned into index-friendly reads.

``customer_id=42 timeout`` finds the dead letters whose payload field ``customer_id`` is
42 and that match "timeout" by id, key or error text. Terms of the form ``field=value``
filter by payload field; everything else is one text term.

* A payload field named in ``SQLQUEUE["SEARCH_FIELDS"]`` is matched through its index.
* A number is a dead letter's own offset (its id on the page) or its original's offset.
* Text is a key or message id (exact), looked up through the log's indexes.
* Any other payload field, and error text, have no index: they are searched among the
  newest RECENT_WINDOW dead letters only, and the page says so.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Q, QuerySet

from ..conf import get_settings
from ..models import Topic
from ..models.payload_search import FIELD_RE, indexed_column, match_lookup

RECENT_WINDOW = 10_000  # newest dead letters searched where no index helps
EXACT_MATCHES = 1_000  # rows taken from each exact lookup (id, key)
_TERM_RE = re.compile(r"(?P<field>[^=\s]+)=(?P<value>.*)", re.DOTALL)


@dataclass
class SearchNotes:
    """What the search could not do fully, shown above the results."""

    bounded: list[str] = field(default_factory=list)  # what was searched in recent rows only
    errors: list[str] = field(default_factory=list)  # terms that were not understood

    def messages(self) -> list[str]:
        notes = [f"Not understood: {error}." for error in self.errors]
        if self.bounded:
            notes.append(
                f"{' and '.join(self.bounded)} searched in the newest {RECENT_WINDOW:,} dead "
                "letters only (declare payload fields in SQLQUEUE['SEARCH_FIELDS'] to search "
                "them all by exact value).")
        return notes


def split_terms(text: str) -> tuple[list[tuple[str, str]], str]:
    """(payload field terms, the remaining text) of a search."""
    try:
        words = shlex.split(text)
    except ValueError:  # an unbalanced quote: take the words as typed
        words = text.split()
    fields, rest = [], []
    for word in words:
        match = _TERM_RE.fullmatch(word)
        if match and match["value"] != "":
            fields.append((match["field"], match["value"]))
        else:
            rest.append(word)
    return fields, " ".join(rest)


def search_dead_letters(queryset: QuerySet[Any], text: str) -> tuple[QuerySet[Any], SearchNotes]:
    """``queryset`` narrowed to the dead letters matching ``text``."""
    notes = SearchNotes()
    fields, rest = split_terms(text.strip())
    using = queryset.db
    connection = connections[using]
    declared = {name.lower(): name for name in get_settings().search_fields}
    bounded = False
    for name, value in fields:
        if not FIELD_RE.fullmatch(name):
            notes.errors.append(f"{name!r} is not a payload field name")
            return queryset.none(), notes
        indexed = name.lower() in declared and (
            connection.vendor != "mysql" or indexed_column(connection, declared[name.lower()])
            is not None)
        if indexed:
            name = declared[name.lower()]
        else:
            bounded = True
            notes.bounded.append(f"payload field {name!r}")
        queryset = queryset.filter(match_lookup(connection, name, value, indexed))
    if rest:
        notes.bounded.append("ids of originals and error text")
        recent = Q(original_id=rest) | Q(message_id=rest) | Q(last_error__icontains=rest)
        if _is_offset(rest):
            recent |= Q(original_offset=int(rest))
        queryset = queryset.filter(
            Q(offset__in=_exact_offsets(queryset, rest))
            | (_recent(queryset) & recent))
    elif bounded:
        queryset = queryset.filter(_recent(queryset))
    return queryset, notes


def _recent(queryset: QuerySet[Any]) -> Q:
    """The newest RECENT_WINDOW dead letters (by failure time, read off the
    queue_msg_dead_letters index), as a condition."""
    floor = list(queryset.model.objects.using(queryset.db).order_by("-failed_at", "-offset")
                 .values_list("failed_at", flat=True)[RECENT_WINDOW - 1:RECENT_WINDOW])
    return Q(failed_at__gte=int(floor[0])) if floor else Q()


def _is_offset(text: str) -> bool:
    return text.isdecimal() and text.isascii() and len(text) <= 18


def _exact_offsets(queryset: QuerySet[Any], text: str) -> list[int]:
    """Offsets of dead letters that ``text`` names exactly, each found through an index of
    the log: the dead letter's own offset, or its key."""
    base = queryset.model.objects.using(queryset.db)
    offsets: set[int] = set()
    if _is_offset(text):
        offsets.update(base.filter(offset=int(text)).values_list("offset", flat=True))
    # The dead-letter topics, so that the unique (topic, message_key, id) index finds a key.
    suffix = get_settings().dlq_suffix
    topics = list(Topic.objects.using(queryset.db).filter(topic__endswith=suffix)
                  .values_list("topic", flat=True))
    if topics:
        offsets.update(base.filter(topic__in=topics, message_key=text)
                       .values_list("offset", flat=True)[:EXACT_MATCHES])
    return sorted(offsets)
