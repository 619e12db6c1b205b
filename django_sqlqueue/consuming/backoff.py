"""How long a failed message waits before its next attempt."""

from __future__ import annotations

import logging
import math
import random
from typing import Any, Protocol

logger = logging.getLogger("django_sqlqueue.worker")

# The longest a failed message waits for its next attempt, whatever a Retry or a backoff
# asks for: a waiting message holds its partition's watermark, and with it GC, back.
MAX_RETRY_DELAY = 30 * 24 * 3600.0


class Backoff(Protocol):
    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 = first delivery)."""
        ...


class ExponentialBackoff:
    """``base * 2**(attempt-1)`` seconds, capped, with full jitter by default.

    Jitter spreads the retries of a burst of failures so they do not return together.
    """

    def __init__(self, base: float = 1.0, cap: float = 300.0, jitter: bool = True) -> None:
        if not base > 0:
            raise ValueError(f"ExponentialBackoff base must be > 0 seconds, got {base!r}")
        if not cap >= base:
            raise ValueError(f"ExponentialBackoff cap must be >= base ({base!r}), got {cap!r}")
        self.base = float(base)
        self.cap = float(cap)
        self.jitter = jitter

    def delay(self, attempt: int) -> float:
        ceiling = min(self.cap, self.base * 2 ** max(0, min(attempt - 1, 60)))
        if self.jitter:
            # "Equal jitter": at least half the exponential delay, so retries still back off.
            return float(ceiling / 2 + random.uniform(0, ceiling / 2))  # noqa: S311 - jitter, not a secret
        return float(ceiling)

    def __repr__(self) -> str:
        return f"ExponentialBackoff(base={self.base}, cap={self.cap}, jitter={self.jitter})"


DEFAULT_BACKOFF = ExponentialBackoff()


def retry_delay(backoff: Backoff, attempt: int, requested: Any = None) -> float:
    """Seconds before the next attempt: ``requested`` (a Retry's delay) or the backoff's,
    always a finite number from 0 to MAX_RETRY_DELAY.

    A backoff that raises or returns something else is a bug in it, not in the message:
    it is logged and the default backoff decides instead, so the retry is still recorded.
    """
    if requested is None:
        try:
            requested = backoff.delay(attempt)
        except Exception as exc:  # noqa: BLE001 - a broken backoff must not lose the retry
            logger.error("backoff %r failed for attempt %s, using the default backoff: %s: %s",
                         backoff, attempt, type(exc).__name__, exc)
            requested = DEFAULT_BACKOFF.delay(attempt)
    if (not isinstance(requested, int | float) or isinstance(requested, bool)
            or math.isnan(requested)):
        logger.error("backoff %r returned %r for attempt %s, not a number of seconds; using "
                     "the default backoff", backoff, requested, attempt)
        requested = DEFAULT_BACKOFF.delay(attempt)
    if requested > MAX_RETRY_DELAY:
        logger.warning("retry delay of %s s capped at %.0f s", requested, MAX_RETRY_DELAY)
    return float(min(max(requested, 0.0), MAX_RETRY_DELAY))
