"""Riding out database faults: deadlocks, lock timeouts, a locked SQLite file, restarts,
and a database that cannot be reached yet when a process starts (a restart, a failover)."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable

from django.db import connections

from ..db.errors import is_disconnect, is_transient, is_unreachable
from ..exceptions import SQLQueueError
from ..logtext import loggable

logger = logging.getLogger("django_sqlqueue.worker")

MIN_DELAY = 0.05  # seconds before the first retry
MAX_DELAY = 5.0  # seconds, the longest wait between retries
# Seconds between two lines of a process waiting for its database: the retries start 50 ms
# apart, and a failover would otherwise print a screenful in its first second.
REPORT_EVERY = 1.0


class DatabaseUnreachable(SQLQueueError):
    """The database could not be reached within the time given; ``__cause__`` is the last
    error."""

    def __init__(self, using: str, seconds: float, last: BaseException) -> None:
        super().__init__(f"database {using!r} unreachable for {seconds:.1f}s: {one_line(last)}")
        self.using = using


class FaultBackoff:
    """Decides how long to wait after a failed step, and logs one line per incident."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.failures = 0

    def succeeded(self) -> None:
        if self.failures:
            logger.info("database recovered after %s failed attempt(s)", self.failures)
        self.failures = 0

    def failed(self, step: str, exc: BaseException, *, log: bool = True) -> float:
        """Record a failure of ``step``; return the seconds to wait before trying again.
        ``log=False``: the caller says so itself."""
        self.failures += 1
        transient = is_transient(exc)
        if is_disconnect(exc) or not transient:
            # A dead (or suspect) connection is dropped so the next query opens a new one.
            # Closing a broken connection may fail too; either way it is gone.
            with contextlib.suppress(Exception):
                connections[self.using].close()
        delay = min(MAX_DELAY, MIN_DELAY * 2 ** min(self.failures - 1, 10))
        delay = delay / 2 + random.uniform(0, delay / 2)
        if not log:
            return float(delay)
        if transient:
            logger.warning(
                "step=%s transient database error, retrying in %.2fs attempt=%s error=%s",
                step, delay, self.failures, one_line(exc),
            )
        else:
            logger.error(
                "step=%s unexpected error, retrying in %.2fs attempt=%s error=%s",
                step, delay, self.failures, one_line(exc), exc_info=exc,
            )
        return float(delay)


def one_line(exc: BaseException) -> str:
    """``exc`` as one log-safe line: its type and message, whitespace folded."""
    return loggable(" ".join(f"{type(exc).__name__}: {exc}".split()), 300)


def wait_for_database(using: str, *, timeout: float | None = None,
                      sleep: Callable[[float], object] | None = None,
                      report: Callable[[str], object] | None = None) -> None:
    """Return once the database ``using`` answers a query.

    A process started while its database restarts or fails over retries its first
    connection as the worker retries any later fault: with backoff (at most MAX_DELAY
    apart), saying so at most once per REPORT_EVERY (through ``report``, else the log). A
    refusal no retry cures (bad credentials, an unknown database) and errors that are not
    about reaching the database are raised at once. With ``timeout`` (seconds), gives up
    after that long with :class:`DatabaseUnreachable`.
    """
    # An Event's wait, as every other wait of the worker: time.sleep() fails with EINVAL
    # where the wall clock is shifted by libfaketime (a skewed host in the chaos run).
    sleep = sleep or threading.Event().wait
    backoff = FaultBackoff(using)
    started = time.monotonic()
    next_report = started
    while True:
        try:
            connection = connections[using]
            connection.ensure_connection()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as exc:
            if not is_unreachable(exc, connections[using].vendor):
                raise
            delay = backoff.failed("connect", exc, log=False)
            now = time.monotonic()
            if timeout is not None:
                if now - started >= timeout:
                    raise DatabaseUnreachable(using, now - started, exc) from exc
                delay = min(delay, timeout - (now - started))
            if now >= next_report:
                next_report = now + REPORT_EVERY
                # The worker's line for any transient fault, one step named "connect".
                line = (f"step=connect transient database error, retrying in {delay:.2f}s "
                        f"database={using} attempt={backoff.failures} error={one_line(exc)}")
                if report is None:
                    logger.warning("%s", line)
                else:
                    report(line)
            sleep(delay)
            continue
        backoff.succeeded()
        return
