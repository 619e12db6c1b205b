"""Operator actions on recurring schedules: list, pause, resume, run now. The CLI
(``manage.py sqlqueue schedules``) and the admin call these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from .. import schedules
from ..conf import queue_database
from ..models import Schedule
from ..rows import epoch_ms_to_datetime
from ..scheduling.firing import fire, manual_id
from ..scheduling.spec import ScheduleNotFound, from_definition
from .errors import OperationError

__all__ = ["ScheduleRow", "UnknownSchedule", "list_schedules", "pause_schedule",
           "resume_schedule", "run_now"]


class UnknownSchedule(OperationError):
    """No schedule has this name."""


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule as an operator sees it."""

    name: str
    cron: str
    timezone: str
    target: str
    origin: str  # "settings" or "api"
    paused: bool
    next_run_at: datetime
    last_run_at: datetime | None
    last_message: str
    reason: str = ""  # why its due ticks wait for another release's workers; "" if none


def list_schedules(*, using: str | None = None) -> list[ScheduleRow]:
    """Every schedule, by name."""
    using = using or queue_database()
    return [ScheduleRow(
        r.name, r.cron, r.timezone, r.target, r.origin, r.paused,
        epoch_ms_to_datetime(r.next_run_at),
        None if r.last_run_at is None else epoch_ms_to_datetime(r.last_run_at), r.last_message,
        r.reason,
    ) for r in Schedule.objects.using(using).order_by("name")]


def pause_schedule(name: str, *, using: str | None = None) -> bool:
    """Stop ``name`` firing; False if it was paused already."""
    using = using or queue_database()
    try:
        return schedules.pause(name, using=using)
    except ScheduleNotFound as exc:
        raise UnknownSchedule(str(exc)) from exc


def resume_schedule(name: str, *, using: str | None = None) -> bool:
    """Let ``name`` fire again from its next tick; False if it was not paused."""
    using = using or queue_database()
    try:
        return schedules.resume(name, using=using)
    except ScheduleNotFound as exc:
        raise UnknownSchedule(str(exc)) from exc


def run_now(name: str, *, using: str | None = None) -> str:
    """Publish ``name``'s message (or enqueue its task) now, once, outside its ticks; its
    next tick is unchanged. Returns the message id (``schedule:<name>:now:<ms>``)."""
    using = using or queue_database()
    with transaction.atomic(using=using):
        row = Schedule.objects.using(using).filter(name=name).first()
        if row is None:
            raise UnknownSchedule(f"no schedule is named {name!r}")
        message_id = manual_id(name, Schedule.objects.now_ms(using))
        fire(from_definition(row.name, row.definition), message_id, using)
    return message_id
