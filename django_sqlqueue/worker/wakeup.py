"""Wake-up on commit (PostgreSQL): a thread that LISTENs and wakes the poll loop.

The listener holds one connection of its own (see docs/operating.md for what a pooler
does to it). A notification for one of the worker's topics sets the loop's wake event, so
the loop polls at once instead of at the end of its poll interval. Each time it reads, the
listener drains every notification pending on its connection and folds them into one
wake-up (a poll reads everything committed anyway); it then pauses ``COALESCE`` and
drains again, so it reads as fast as the server sends, however many publishers notify,
and never leaves the server's notification queue to grow behind it. Nothing depends on a
notification arriving: a dropped connection is reopened with a growing pause meanwhile,
and polling finds every message either way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from typing import Any

from ..db import notify, pooling
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
# Batches read in one fold at most (each is what one read of the socket holds, often
# hundreds of notifications): a fold ends, and wakes the loop, even under a flood.
DRAIN_BATCHES = 1000


class Listener:
    """Sets ``wake`` whenever a message of ``topics`` commits."""

    def __init__(self, topics: Iterable[str], wake: threading.Event, using: str,
                 worker_name: str) -> None:
        self.topics = frozenset(topics)
        self.wake = wake
        self.using = using
        self.name = f"sqlqueue listener {worker_name}"
        self.listening = threading.Event()  # set while a LISTEN connection is open
        # Set with ``wake`` for a notification (not for a reconnection); the loop clears it.
        self.notified = threading.Event()
        self.received = 0  # notifications read (any topic), for tests and benchmarks
        self.wakeups = 0  # folds that woke the loop
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
                    logger.info("no wake-up on commit: %s; polling only",
                                "the database goes through a transaction pooler and "
                                "SQLQUEUE['DIRECT_DATABASE'] names no direct connection"
                                if pooling.session_alias(self.using) is None
                                else "the database driver is not psycopg 3")
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
            if not self.topics.isdisjoint(self._drain(conn)):
                self.wakeups += 1
                self.notified.set()
                self.wake.set()
                # What arrives meanwhile waits on the socket, read by the next drain.
                self._stopping.wait(COALESCE)

    def _drain(self, conn: Any) -> set[str]:
        """The topics named by every notification pending, waiting up to WAIT_SLICE for
        the first one."""
        topics: set[str] = set()
        read = self._read(conn.notifies(timeout=WAIT_SLICE, stop_after=1), topics)
        batches = 1
        # timeout=0: one read of what the socket holds now, no wait.
        while read and batches < DRAIN_BATCHES:
            read = self._read(conn.notifies(timeout=0), topics)
            batches += 1
        return topics

    def _read(self, notes: Iterable[Any], topics: set[str]) -> int:
        count = 0
        for note in notes:
            topics.add(note.payload)
            count += 1
        self.received += count
        return count
