"""How many messages a worker keeps in flight: handed out, running or queued for a thread.

The floor, ``max(10 × concurrency, 100)``, is what a worker always may hold. Above it, the
worker prefetches only what its handler threads finish within ``QUEUE_SECONDS``, judged
by how long its handlers have been taking, up to ``CEILING_FACTOR`` times the floor.

Quick handlers are why: every poll cycle costs its statements and a commit whatever it
carries, so a worker whose handlers take a millisecond spends less per message on bigger
cycles. Slow handlers are why not further: a message queued behind slow ones waits in the
worker with its visibility held, and a stopping worker has to run it first.
"""

from __future__ import annotations

# Seconds of the handler threads' work that prefetching above the floor may queue.
QUEUE_SECONDS = 0.5
CEILING_FACTOR = 5
# Weight of the latest handler's time in the running mean.
SMOOTHING = 0.05


def floor(concurrency: int) -> int:
    return max(concurrency * 10, 100)


class Prefetch:
    """The in-flight cap of one worker, from its handlers' mean run time."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.floor = floor(concurrency)
        self.ceiling = self.floor * CEILING_FACTOR
        self._mean: float | None = None  # seconds per handler run

    def ran(self, seconds: float) -> None:
        """A handler ran ``seconds`` (called from the handler threads: a racy update
        only blurs the mean)."""
        mean = self._mean
        self._mean = seconds if mean is None else mean + SMOOTHING * (seconds - mean)

    @property
    def cap(self) -> int:
        mean = self._mean
        if mean is None:
            return self.floor
        quick = int(self.concurrency * QUEUE_SECONDS / max(mean, 1e-6))
        return max(self.floor, min(self.ceiling, quick))
