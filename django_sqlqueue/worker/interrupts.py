"""SIGTERM/SIGINT handling: the first signal asks the worker to stop, the second exits."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger("django_sqlqueue.worker")

IMMEDIATE_EXIT_STATUS = 1  # after a second signal: in-flight messages are redelivered later


@contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Install the handlers for the duration of the block, then restore the previous ones.

    Outside the main thread (a worker embedded in tests or another program) nothing is
    installed: only the main thread may set signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        if received > 1:
            logger.warning("second signal: exiting now; in-flight messages will be redelivered "
                           "after their visibility timeout")
            os._exit(IMMEDIATE_EXIT_STATUS)
        logger.info("signal %s: finishing in-flight messages, then stopping", signum)
        stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
