"""Storing schedules: those of ``SQLQUEUE["SCHEDULES"]`` synced into the table, and those
the API adds, kept until removed.

A schedule keeps its next tick, pause and history when its definition is stored again
unchanged; a changed cron or time zone starts again from the next tick after now. A new
schedule never fires for ticks before it was stored.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from ..conf import get_settings, queue_database
from ..db.schema_state import holds_queue_table
from ..models import Schedule
from ..models.schedules import ORIGIN_API, ORIGIN_SETTINGS
from . import cron
from .spec import InvalidSchedule, ScheduleSpec, normalize

logger = logging.getLogger("django_sqlqueue.schedules")


def sync_settings(using: str | None = None) -> None:
    """Store the schedules of ``SQLQUEUE["SCHEDULES"]``: add new ones, redefine changed
    ones. Those these settings do not declare are kept, pause and next tick included:
    another release's workers (a rolling deploy, a rollback) may declare them, and this
    release's workers leave them to those (see ticking). Invalid entries are skipped (the
    system checks report them)."""
    alias = using or queue_database()
    declared = get_settings().schedules
    specs = []
    for name, options in (declared.items() if isinstance(declared, dict) else []):
        try:
            specs.append(normalize(name, options))
        except InvalidSchedule as exc:
            logger.error("schedule not synced, fix SQLQUEUE['SCHEDULES']: %s", exc)
    with transaction.atomic(using=alias):
        now_ms = Schedule.objects.now_ms(alias)
        existing = Schedule.objects.defined([s.name for s in specs], alias)
        for spec in specs:
            row = existing.get(spec.name)
            if row is not None and row.origin != ORIGIN_SETTINGS:
                logger.warning("schedule %s is declared in SQLQUEUE['SCHEDULES']: the settings "
                               "replace the one added at run time", spec.name)
        _store(specs, existing, ORIGIN_SETTINGS, now_ms, alias)
        undeclared = Schedule.objects.settings_except([s.name for s in specs], alias)
    if undeclared:
        logger.info("schedules not declared in these settings kept (not fired by this "
                    "release; schedules.remove() deletes them) names=%s",
                    ",".join(undeclared[:20]))


def save(spec: ScheduleSpec, using: str) -> Schedule:
    """Store a schedule added at run time (the API); refuse a name the settings declare."""
    with transaction.atomic(using=using):
        now_ms = Schedule.objects.now_ms(using)
        existing = Schedule.objects.defined([spec.name], using)
        row = existing.get(spec.name)
        if row is not None and row.origin == ORIGIN_SETTINGS:
            raise InvalidSchedule(f"schedule {spec.name!r} is declared in "
                                  "SQLQUEUE['SCHEDULES']; change it there, or add yours under "
                                  "another name")
        _store([spec], existing, ORIGIN_API, now_ms, using)
        return Schedule.objects.using(using).get(name=spec.name)


def _store(specs: list[ScheduleSpec], existing: dict[str, Schedule], origin: str, now_ms: int,
           using: str) -> None:
    new = []
    for spec in specs:
        row = existing.get(spec.name)
        if row is None:
            new.append(Schedule(
                name=spec.name, origin=origin, cron=spec.cron, timezone=spec.timezone,
                catch_up=spec.catch_up, target=spec.target, definition=spec.definition_json(),
                next_run_at=_first_tick(spec, now_ms), created_at=now_ms, updated_at=now_ms))
            continue
        if (row.origin, row.definition) == (origin, spec.definition_json()):
            continue
        if (row.cron, row.timezone) != (spec.cron, spec.timezone):
            row.next_run_at = _first_tick(spec, now_ms)
        row.origin, row.cron, row.timezone, row.catch_up = (origin, spec.cron, spec.timezone,
                                                            spec.catch_up)
        row.target, row.definition, row.updated_at = spec.target, spec.definition_json(), now_ms
        Schedule.objects.redefine(row, using)
    if new:
        Schedule.objects.add_new(new, using)


def _first_tick(spec: ScheduleSpec, now_ms: int) -> int:
    return cron.next_tick(spec.cron, cron.zone(spec.timezone), now_ms)


def sync_after_migrate(using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    """``post_migrate`` receiver: :func:`sync_settings` once the table exists, on the
    queue's own alias (schedules live there even when they fire to a topic placed on
    another alias)."""
    if using == queue_database() and holds_queue_table(using, Schedule._meta.db_table):
        sync_settings(using)
