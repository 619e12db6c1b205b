"""The scheduler: fires the due ticks of recurring schedules, in a thread of its own.

Every worker runs one, so schedules fire while any worker is up. Idle, it costs one
statement a second, whatever the number of schedules: the earliest ``next_run_at`` of
the running schedules, read through an index, with the database's clock. It sleeps until
that tick (at most LOOK_INTERVAL, so schedules added or resumed meanwhile are seen), then
claims and fires the due schedules (see :mod:`django_sqlqueue.scheduling.ticking`). Its
own connection keeps a slow firing from delaying the poll loop's lease renewals.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from django.db import connections

from ..db.errors import is_disconnect, is_transient
from ..logtext import loggable
from ..models import Schedule
from ..scheduling.definitions import sync_settings
from ..scheduling.ticking import CLAIM_BATCH, HeldSchedules, fire_due

logger = logging.getLogger("django_sqlqueue.worker")

LOOK_INTERVAL = 1.0  # seconds, the longest an idle scheduler goes without a look
RETRY_DELAY = 2.0  # seconds after a failed look or firing
AFTER_FIRING = 0.05  # seconds until the look after a firing, which finds the next tick
BUSY_ELSEWHERE = 0.25  # seconds until the next look when another worker holds the due rows


class Scheduler:
    """Syncs the settings' schedules at start, then fires due ticks until stopped."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.synced = False
        self.held = HeldSchedules()  # those this release cannot fire, passed over a while
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sqlqueue-scheduler",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait for it (a firing in progress commits first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            delay = 0.0
            while not self._stop.wait(delay):
                delay = self.step()
        finally:
            connections[self.using].close()

    def step(self) -> float:
        """Sync the settings once, look at the earliest tick, fire what is due; return the
        seconds until the next look."""
        try:
            if not self.synced:
                sync_settings(self.using)
                self.synced = True
            earliest, now_ms = Schedule.objects.next_due(self.using, self.held.names())
            if earliest is None or earliest > now_ms:
                wait = LOOK_INTERVAL if earliest is None else (earliest - now_ms) / 1000
                return min(LOOK_INTERVAL, wait)
            # Claimed in batches until none is left due that another worker is not firing.
            claimed = fire_due(now_ms, self.using, held=self.held)
            while claimed == CLAIM_BATCH and not self._stop.is_set():
                claimed = fire_due(now_ms, self.using, held=self.held)
            # Nothing claimed: the due rows are another worker's, which is firing them.
            return BUSY_ELSEWHERE if claimed == 0 else AFTER_FIRING
        except Exception as exc:  # noqa: BLE001 - the scheduler must never stop the worker
            if is_transient(exc):
                logger.info("schedules postponed: %s: %s", type(exc).__name__,
                            loggable(" ".join(str(exc).split()), 200))
            else:
                logger.error("schedules failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
            if is_disconnect(exc) or not is_transient(exc):
                with contextlib.suppress(Exception):
                    connections[self.using].close()
            return RETRY_DELAY
