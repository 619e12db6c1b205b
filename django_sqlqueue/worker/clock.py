"""The database server's clock, as seen from this process."""

from __future__ import annotations

import time


class DatabaseClock:
    """Epoch milliseconds by the database server's clock.

    Every poll reads the server's time; between polls the local monotonic clock fills in.
    Leases, visibility and delays are therefore judged by one clock for all workers, even
    when a worker's own wall clock is minutes off.
    """

    def __init__(self) -> None:
        self._server_ms = 0
        self._at = time.monotonic()

    def sync(self, server_ms: int) -> None:
        self._server_ms = server_ms
        self._at = time.monotonic()

    def now_ms(self) -> int:
        return self._server_ms + int((time.monotonic() - self._at) * 1000)
