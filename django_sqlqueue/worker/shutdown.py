"""Stopping a worker: in-flight handlers get a grace period to finish, and the polls
during it record their outcomes before every lease is released."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from .partitions import Partition

logger = logging.getLogger("django_sqlqueue.worker")

DRAIN_POLL = 0.05  # seconds between polls while handlers finish


def drain(partitions: Iterable[Partition], grace: float, busy: Callable[[], int],
          poll: Callable[[], object], pending: Callable[[], bool],
          wake: threading.Event) -> int:
    """Stop fetching, and poll until no handler runs and no outcome waits to be recorded,
    for ``grace`` seconds at most; return how many handlers still run."""
    for partition in partitions:
        partition.draining = True
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        running = busy()
        poll()
        if not running and not pending():
            break
        wake.wait(min(DRAIN_POLL, max(0.0, deadline - time.monotonic())))
        wake.clear()
    abandoned = busy()
    if abandoned:
        logger.warning(
            "shutdown grace over with %s handler(s) still running; their messages will "
            "be redelivered after the visibility timeout", abandoned,
        )
    return abandoned
