"""How long a failed message waits before its next attempt."""

from __future__ import annotations

import random
from typing import Protocol


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
            return float(ceiling / 2 + random.uniform(0, ceiling / 2))
        return float(ceiling)

    def __repr__(self) -> str:
        return f"ExponentialBackoff(base={self.base}, cap={self.cap}, jitter={self.jitter})"
