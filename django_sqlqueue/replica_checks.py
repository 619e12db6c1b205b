"""The system check of ``SQLQUEUE["READ_DATABASE"]`` (``sqlqueue.E018``): each read alias
is a replica of an alias holding queue tables. Registered by importing
:mod:`django_sqlqueue.checks`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from .conf import queue_aliases, queue_database, raw_settings
from .docs import see


@register("sqlqueue")
def check_read_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """``SQLQUEUE["READ_DATABASE"]`` maps queue aliases to replicas of them (``E018``): an
    alias of DATABASES, on the same engine, keyed by an alias that holds queue tables, and
    not itself another queue alias (whose tables it would show instead)."""
    value = raw_settings()["READ_DATABASE"]
    if value is None:
        return []
    hint = see("operating", "Read replicas")
    queues = queue_aliases()
    if isinstance(value, str):
        pairs = [(queue_database(), value)]
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        return [Error("SQLQUEUE['READ_DATABASE'] must be None, an alias of DATABASES or a "
                      f"dict {{queue alias: read alias}}, got {value!r}.", hint=hint,
                      id="sqlqueue.E018")]
    known = ", ".join(map(repr, settings.DATABASES))
    errors: list[CheckMessage] = []
    for queue, replica in pairs:
        where = "SQLQUEUE['READ_DATABASE']" + (f"[{queue!r}]" if isinstance(value, dict) else "")
        if queue not in queues:
            errors.append(Error(
                f"SQLQUEUE['READ_DATABASE'] has the key {queue!r}, which holds no queue tables "
                f"(the queue's aliases: {', '.join(map(repr, sorted(queues)))}).",
                hint=hint, id="sqlqueue.E018"))
        elif not isinstance(replica, str) or replica not in settings.DATABASES:
            errors.append(Error(f"{where} must name an alias of DATABASES ({known}), got "
                                f"{replica!r}.", hint=hint, id="sqlqueue.E018"))
        elif replica != queue and replica in queues:
            errors.append(Error(
                f"{where} is {replica!r}, which holds queue tables of its own: pages would "
                f"show its queue instead of {queue!r}'s.", hint=hint, id="sqlqueue.E018"))
        elif (queue in settings.DATABASES and settings.DATABASES[queue].get("ENGINE")
              != settings.DATABASES[replica].get("ENGINE")):
            errors.append(Error(
                f"{where} is {replica!r}, on another engine than {queue!r} "
                f"({settings.DATABASES[replica].get('ENGINE')} and "
                f"{settings.DATABASES[queue].get('ENGINE')}): a replica is a copy of the "
                "same database.", hint=hint, id="sqlqueue.E018"))
    return errors
