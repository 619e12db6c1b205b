"""Riding out database faults: deadlocks, lock timeouts, a locked SQLite file, restarts."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable

from django.db import connections

from ..db.errors import is_disconnect, is_transient
from ..logtext import loggable

logger = logging.getLogger("django_sqlqueue.worker")

MIN_DELAY = 0.05  # seconds before the first retry
MAX_DELAY = 5.0  # seconds, the longest wait between retries


class FaultBackoff:
    """Decides how long to wait after a failed step, and logs one line per incident."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.failures = 0

    def succeeded(self) -> None:
        if self.failures:
            logger.info("database recovered after %s failed attempt(s)", self.failures)
        self.failures = 0

    def failed(self, step: str, exc: BaseException) -> float:
        """Record a failure of ``step``; return the seconds to wait before trying again."""
        self.failures += 1
        transient = is_transient(exc)
        if is_disconnect(exc) or not transient:
            # A dead (or suspect) connection is dropped so the next query opens a new one.
            # Closing a broken connection may fail too; either way it is gone.
            with contextlib.suppress(Exception):
                connections[self.using].close()
        delay = min(MAX_DELAY, MIN_DELAY * 2 ** min(self.failures - 1, 10))
        delay = delay / 2 + random.uniform(0, delay / 2)
        if transient:
            logger.warning(
                "step=%s transient database error, retrying in %.2fs attempt=%s error=%s",
                step, delay, self.failures, _one_line(exc),
            )
        else:
            logger.error(
                "step=%s unexpected error, retrying in %.2fs attempt=%s error=%s",
                step, delay, self.failures, _one_line(exc), exc_info=exc,
            )
        return float(delay)


def _one_line(exc: BaseException) -> str:
    return loggable(" ".join(f"{type(exc).__name__}: {exc}".split()), 300)


def wait_for_database(using: str, sleep: Callable[[float], object] = time.sleep) -> None:
    """Return once the database answers, retrying with backoff (at most MAX_DELAY apart)
    and logging each failed try: a worker started while its database restarts waits for
    it instead of failing on its first query. Errors other than an unreachable server
    (bad credentials, say) are raised at once."""
    backoff = FaultBackoff(using)
    while True:
        try:
            connection = connections[using]
            connection.ensure_connection()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as exc:
            if not is_disconnect(exc) or _refused_login(exc):
                raise
            sleep(backoff.failed("connect", exc))
            continue
        backoff.succeeded()
        return


def _refused_login(exc: BaseException) -> bool:
    """The server answered and refused us: waiting will not help."""
    text = str(exc).lower()
    return "access denied" in text or "authentication failed" in text or \
        "does not exist" in text or "unknown database" in text
