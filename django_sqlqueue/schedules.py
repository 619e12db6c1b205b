"""Recurring schedules added at run time (per tenant, say), next to those declared in
``SQLQUEUE["SCHEDULES"]``; see docs/scheduling.md.

    from django_sqlqueue import schedules

    schedules.add("report-42", cron="0 8 * * MON", timezone="Europe/Paris",
                  task="shop.tasks.weekly_report", kwargs={"tenant": 42})
    schedules.pause("report-42"); schedules.resume("report-42"); schedules.remove("report-42")

Each runs on the caller's connection, inside the caller's transaction when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .conf import get_settings, queue_database
from .models import Schedule
from .models.schedules import ORIGIN_SETTINGS
from .scheduling import cron
from .scheduling.definitions import save
from .scheduling.spec import InvalidSchedule, ScheduleNotFound, normalize

__all__ = ["InvalidSchedule", "ScheduleNotFound", "add", "get", "pause", "remove", "resume"]


def add(
    name: str,
    *,
    cron: str,
    task: str | None = None,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    topic: str | None = None,
    payload: Any = None,
    key: str = "",
    headers: Mapping[str, str] | None = None,
    timezone: str = "UTC",
    catch_up: str = "latest",
    using: str | None = None,
) -> Schedule:
    """Create the schedule ``name``, or redefine it: a ``task`` (dotted path of a @task
    function) or a message (``topic``, ``payload``, ``key``, ``headers``) on each tick of
    ``cron``. Its first tick is the next one after now. Raises InvalidSchedule."""
    options: dict[str, Any] = {"cron": cron, "timezone": timezone, "catch_up": catch_up}
    if task is not None:
        options.update(task=task, args=list(args or []), kwargs=dict(kwargs or {}))
    if topic is not None:
        options.update(topic=topic, payload=payload, key=key, headers=dict(headers or {}))
    if task is None and (args is not None or kwargs is not None):
        raise InvalidSchedule(f"schedule {name!r}: args and kwargs go with task=")
    return save(normalize(name, options), _alias(using))


def remove(name: str, *, using: str | None = None) -> None:
    """Delete the schedule ``name``; it fires no more. Raises ScheduleNotFound, or
    InvalidSchedule for a schedule these settings declare (remove it there first: workers
    keep a schedule no longer declared until it is removed here)."""
    alias = _alias(using)
    row = get(name, using=alias)
    declared = get_settings().schedules
    if row.origin == ORIGIN_SETTINGS and name in (declared if isinstance(declared, dict)
                                                  else {}):
        raise InvalidSchedule(f"schedule {name!r} is declared in SQLQUEUE['SCHEDULES']; remove "
                              "it there (workers and migrate sync the settings)")
    Schedule.objects.using(alias).filter(name=name).delete()


def pause(name: str, *, using: str | None = None) -> bool:
    """Stop ``name`` firing until resumed; False if it was paused already."""
    return _set_paused(name, True, _alias(using))


def resume(name: str, *, using: str | None = None) -> bool:
    """Let ``name`` fire again from its next tick after now (the ticks that passed while
    it was paused are not fired); False if it was not paused."""
    return _set_paused(name, False, _alias(using))


def get(name: str, *, using: str | None = None) -> Schedule:
    """The schedule ``name``; raises ScheduleNotFound."""
    row = Schedule.objects.using(_alias(using)).filter(name=name).first()
    if row is None:
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    return row


def _set_paused(name: str, paused: bool, alias: str) -> bool:
    row = get(name, using=alias)
    now_ms = Schedule.objects.now_ms(alias)
    following = None if paused else cron.next_tick(row.cron, cron.zone(row.timezone), now_ms)
    return bool(Schedule.objects.set_paused(name, paused, now_ms, alias, following))


def _alias(using: str | None) -> str:
    return using or queue_database()
