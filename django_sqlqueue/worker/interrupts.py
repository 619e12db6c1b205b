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
def stop_on_signals(stop: Callable[[], None], grace: float | None = None) -> Iterator[None]:
    """Install the handlers for the duration of the block, then restore the previous ones.
    ``grace`` (seconds in-flight handlers get to finish) is said in the first signal's line.

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
        name = signal_name(signum)
        if received > 1:
            logger.warning("second signal %s: exiting now; in-flight messages will be "
                           "redelivered after their visibility timeout", name)
            os._exit(IMMEDIATE_EXIT_STATUS)
        within = "" if grace is None else f" within the {grace:g}s shutdown grace"
        logger.info("received %s: finishing in-flight messages%s, then stopping; send SIGINT "
                    "or SIGTERM again to exit at once", name, within)
        stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15: what an operator sent, by its name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
