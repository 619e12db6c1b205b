"""Firing the due schedules: claim them, fire their ticks, advance them, in one
transaction.

Claiming locks the rows (passing over those another worker holds), so each due row is
fired by one worker; the publish and the advance commit together, so a worker killed
midway leaves the row due and its tick unpublished for the next one to fire; the
message id ``schedule:<name>:<tick>`` makes a tick fired twice, were it ever, publish once.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, transaction

from ..logtext import loggable
from ..models import Schedule
from . import cron
from .firing import fire, tick_id
from .spec import from_definition

logger = logging.getLogger("django_sqlqueue.schedules")

CLAIM_BATCH = 100  # schedules claimed per transaction


def fire_due(now_ms: int, using: str, limit: int = CLAIM_BATCH) -> int:
    """Fire the ticks due at ``now_ms`` (database clock) of up to ``limit`` schedules no
    other worker is firing; return how many schedules were claimed."""
    with transaction.atomic(using=using):
        claimed = Schedule.objects.claim_due(now_ms, limit, using)
        for row in claimed:
            _fire_row(row, now_ms, using)
    return len(claimed)


def _fire_row(row: Schedule, now_ms: int, using: str) -> None:
    spec = from_definition(row.name, row.definition)
    try:
        ticks, following = cron.due_ticks(spec.cron, cron.zone(spec.timezone), row.next_run_at,
                                          now_ms, spec.catch_up)
    except cron.InvalidCron as exc:  # stored by older code, or a time zone since removed
        logger.error("schedule cannot be computed, paused name=%s error=%s", row.name, exc)
        Schedule.objects.set_paused(row.name, True, now_ms, using)
        return
    fired: int | None = None
    fired_id = ""
    for tick in ticks:
        message_id = tick_id(row.name, tick)
        try:
            with transaction.atomic(using=using):  # a savepoint: one bad tick alone undone
                fire(spec, message_id, using)
        except DatabaseError:
            raise  # the database's fault: the whole claim is retried
        except Exception as exc:  # noqa: BLE001 - a task gone or a payload refused: skip it
            logger.error("schedule tick not fired name=%s id=%s error=%s: %s", row.name,
                         message_id, type(exc).__name__, loggable(str(exc), 300))
            continue
        fired, fired_id = tick, message_id
    if len(ticks) > 1:
        logger.info("schedule caught up name=%s ticks=%s", row.name, len(ticks))
    elif not ticks:
        logger.info("schedule skipped missed ticks name=%s catch_up=%s", row.name,
                    spec.catch_up)
    Schedule.objects.advance(row.name, following, fired, fired_id, now_ms, using)
