"""Wake-up on commit (PostgreSQL): a thread that LISTENs and wakes the poll loop.

The listener holds one connection of its own (see docs/operating.md for what a pooler
does to it). A notification for one of the worker's topics sets the loop's wake event, so
the loop polls at once instead of at the end of its poll interval; notifications arriving
while it polls, or within ``COALESCE`` of the last wake-up, fold into one. Nothing depends
on a notification arriving: a dropped connection is reopened with a growing pause
meanwhile, and polling finds every message either way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from typing import Any

from ..db import notify
from ..logtext import loggable

logger = logging.getLogger("django_sqlqueue.worker")

WAIT_SLICE = 0.5  # seconds one wait for notifications lasts before looking for a stop
RECONNECT_FIRST = 0.5  # seconds before reopening a dropped connection, doubled each time
RECONNECT_MOST = 30.0  # seconds, the longest pause between two attempts
# Seconds between two wake-ups at least: a stream of commits (hundreds a second) wakes the
# loop at most this often, each poll reading everything committed since the last one,
# instead of once per transaction. A message alone is not delayed (the pause follows its
# wake-up); under load, fewer and fuller poll cycles (measured: 10 ms gave p99 300-770 ms at
# 500 msg/s where 30 ms gave 60-210 ms, on a loaded machine).
COALESCE = 0.03


class Listener:
    """Sets ``wake`` whenever a message of ``topics`` commits."""

    def __init__(self, topics: Iterable[str], wake: threading.Event, using: str,
                 worker_name: str) -> None:
        self.topics = frozenset(topics)
        self.wake = wake
        self.using = using
        self.name = f"sqlqueue listener {worker_name}"
        self.listening = threading.Event()  # set while a LISTEN connection is open
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqlqueue-listener",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(WAIT_SLICE * 4)

    def _run(self) -> None:
        pause = RECONNECT_FIRST
        while not self._stopping.is_set():
            conn: Any = None
            try:
                conn = notify.listener_connection(self.using, self.name)
                if conn is None:
                    logger.info("no wake-up on commit: the database driver is not psycopg 3; "
                                "polling only")
                    return
                self.listening.set()
                # Messages may have committed while the connection was down: look now.
                self.wake.set()
                logger.info("listening for notifications channel=%s", notify.CHANNEL)
                pause = RECONNECT_FIRST
                self._listen(conn)
            except Exception as exc:  # noqa: BLE001 - polling carries on without it
                self.listening.clear()
                if self._stopping.is_set():
                    break
                logger.warning("listener connection lost, reopening in %.1fs "
                               "(polling meanwhile) error=%s: %s", pause,
                               type(exc).__name__, loggable(exc, 300))
                self._stopping.wait(pause)
                pause = min(pause * 2, RECONNECT_MOST)
            finally:
                self.listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    def _listen(self, conn: Any) -> None:
        while not self._stopping.is_set():
            for note in conn.notifies(timeout=WAIT_SLICE):
                if note.payload in self.topics:
                    self.wake.set()
                    # What arrives meanwhile waits on the socket and sets it again after.
                    self._stopping.wait(COALESCE)
