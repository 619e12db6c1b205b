"""Firing the due schedules: claim them, fire their ticks, advance them, in one
transaction.

Claiming locks the rows (passing over those another worker holds), so each due row is
fired by one worker; the publish and the advance commit together, so a worker killed
midway leaves the row due and its tick unpublished for the next one to fire; the
message id ``schedule:<name>:<tick>`` makes a tick fired twice, were it ever, publish once.

A schedule this worker's release cannot fire (its task module or queue is not in this
release, or this release's settings do not declare it) is left due, not advanced, for a
worker of a release that can: in a rolling deploy the old release's workers see the new
release's schedules. Its reason is recorded on the row and logged once; this worker
passes over it for HELD_RETRY seconds, then tries again.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, transaction

from ..logtext import loggable
from ..models import Schedule
from ..models.schedules import REASON_LENGTH
from . import cron
from .firing import fire, not_here, tick_id
from .spec import from_definition

logger = logging.getLogger("django_sqlqueue.schedules")

CLAIM_BATCH = 100  # schedules claimed per transaction
HELD_RETRY = 30.0  # seconds a worker passes over a schedule its release cannot fire


class HeldSchedules:
    """The schedules this process cannot fire, each passed over until its retry time;
    the reason is logged once per schedule, not per tick or retry."""

    def __init__(self, retry: float = HELD_RETRY) -> None:
        self.retry = retry
        self._until: dict[str, float] = {}
        self._logged: dict[str, str] = {}

    def names(self) -> frozenset[str]:
        """The schedules to pass over now."""
        now = time.monotonic()
        for name in [n for n, until in self._until.items() if until <= now]:
            del self._until[name]
        return frozenset(self._until)

    def hold(self, name: str, reason: str) -> None:
        self._until[name] = time.monotonic() + self.retry
        if self._logged.get(name) != reason:
            self._logged[name] = reason
            logger.warning("schedule left to workers that can fire it name=%s reason=%s",
                           name, reason)

    def fired(self, name: str) -> None:
        self._until.pop(name, None)
        if self._logged.pop(name, None) is not None:
            logger.info("schedule fires here again name=%s", name)


def fire_due(now_ms: int, using: str, limit: int = CLAIM_BATCH,
             held: HeldSchedules | None = None) -> int:
    """Fire the ticks due at ``now_ms`` (database clock) of up to ``limit`` schedules no
    other worker is firing and ``held`` does not pass over; return how many schedules were
    claimed."""
    held = HeldSchedules() if held is None else held
    with transaction.atomic(using=using):
        claimed = Schedule.objects.claim_due(now_ms, limit, using, held.names())
        for row in claimed:
            _fire_row(row, now_ms, using, held)
    return len(claimed)


def _fire_row(row: Schedule, now_ms: int, using: str, held: HeldSchedules) -> None:
    spec = from_definition(row.name, row.definition)
    reason = not_here(spec, row.origin)
    if reason:
        reason = loggable(reason, REASON_LENGTH - 1)  # "…" marks a cut
        held.hold(row.name, reason)
        Schedule.objects.hold(row.name, reason, now_ms, using)
        return
    held.fired(row.name)
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
        except Exception as exc:  # noqa: BLE001 - a payload refused, arguments the task refuses
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
