"""The end of a process that ran an embedded worker.

A server without a shutdown hook (no lifespan events, WSGI, runserver) gets the worker
stopped gracefully at interpreter exit. Handlers still running after the shutdown grace
cannot be stopped from outside, and their threads would hold the exit for as long as they
run: the process then ends with runqueueworker's status for it, as that command does.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from .runner import EmbeddedWorker

logger = logging.getLogger("django_sqlqueue.embedded")

# Seconds the server gets to finish its own shutdown before a process whose handlers were
# abandoned is ended.
ABANDONED_EXIT_DELAY = 2.0


def stop_at_exit(worker: EmbeddedWorker) -> None:
    """Stop ``worker`` gracefully when the interpreter exits."""

    def stop() -> None:
        exit_when_abandoned(worker.stop(), delay=0.0)

    atexit.register(stop)


def exit_when_abandoned(code: int, delay: float = ABANDONED_EXIT_DELAY) -> None:
    """After a stop that left handlers running (exit status 3), end the process once
    ``delay`` seconds have passed."""
    from ..worker.process import EXIT_HANDLERS_ABANDONED

    if code != EXIT_HANDLERS_ABANDONED:
        return

    def end() -> None:
        logger.error("ending the process: handlers were still running after the shutdown "
                     "grace; their messages will be redelivered after the visibility timeout")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    if delay <= 0:
        end()
        return
    timer = threading.Timer(delay, end)
    timer.daemon = True
    timer.start()
