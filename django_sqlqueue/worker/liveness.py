"""A worker's liveness lock: held by a thread on a connection of its own, so the database
itself says the moment the worker's process is gone.

The lock is named after the process's lease token (see :mod:`django_sqlqueue.db.liveness`)
and the server releases it when the connection closes: a ``kill -9``, an OOM kill, a crash.
A process that is alive but slow (SIGSTOP, a long GC pause, a network stall that leaves
its connection open) keeps it, and is judged by its lease as before. The worker writes
its token onto its lease rows and heartbeats only while it holds the lock, so others
never take a lease early from a worker that never held one.

The connection runs nothing but the lock: it waits on its socket, which wakes it at once
when the server ends the session, and checks the lock every ``CHECK_INTERVAL`` (which also
keeps the session from idling out). A lost connection is reopened and the lock taken again
under the same token: other sessions only look at the lock, never take it. Until then
other workers may take this worker's partitions (fenced, as any takeover is).

A worker judges others by their locks only once its own has been held for ``SETTLE``
seconds: after a server restart or a failover every lock is gone until each worker has
reconnected, and a worker that reconnected first must not take everyone's partitions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..db import liveness as locks
from ..logtext import loggable

logger = logging.getLogger("django_sqlqueue.worker")

CHECK_INTERVAL = 5.0  # seconds between checks that the session still holds the lock
# Seconds a worker holds its own lock before it judges others by theirs: longer than the
# others take to reconnect and take theirs again after a server restart (RECONNECT_MOST).
SETTLE = 3.0
RECONNECT_FIRST = 0.1  # seconds before reopening a lost connection, doubled each time
RECONNECT_MOST = 1.0  # seconds, the longest pause between two attempts
STOP_WAIT = 5.0  # seconds stop() waits for the thread (it closes its connection)
# Seconds between two wake-ups of a socket that stays readable: the server sent something
# the check did not consume (a notice), which must not turn the wait into a busy loop.
READABLE_PAUSE = 0.1


@contextlib.contextmanager
def holding(lock: LivenessLock | None) -> Iterator[None]:
    """Hold ``lock`` (when the worker has one) while the block runs: taken from before the
    first heartbeat, which advertises it once held, until after the leases were released."""
    if lock is None:
        yield
        return
    lock.start()
    try:
        yield
    finally:
        lock.stop()


class LivenessLock:
    """Holds the liveness lock of ``token`` on a connection to ``using`` while started."""

    def __init__(self, token: str, using: str) -> None:
        self.token = token
        self.using = using
        self.changes = 0  # times the lock was taken or lost: the worker re-advertises then
        self._held_since: float | None = None  # time.monotonic(); None while not held
        self._state = threading.Lock()
        self._stopping = threading.Event()
        self._wake_read = self._wake_write = -1  # a pipe that wakes the socket wait on stop
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the worker's side

    def start(self) -> None:
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="sqlqueue-liveness",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Release the lock and close the connection (after the leases were released)."""
        self._stopping.set()
        if self._thread is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")
        self._thread.join(STOP_WAIT)
        if not self._thread.is_alive():  # else it may still wait on the pipe
            for fd in (self._wake_read, self._wake_write):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def held(self) -> bool:
        with self._state:
            return self._held_since is not None

    def settled(self) -> bool:
        """Whether the lock has been held for SETTLE seconds without a break."""
        with self._state:
            since = self._held_since
        return since is not None and time.monotonic() - since >= SETTLE

    # ------------------------------------------------------------------ the thread

    def _set_held(self, held: bool) -> None:
        with self._state:
            if (self._held_since is not None) == held:
                return
            self._held_since = time.monotonic() if held else None
            self.changes += 1

    def _run(self) -> None:
        pause = RECONNECT_FIRST
        said = False  # whether this outage was logged: once per outage, not per attempt
        while not self._stopping.is_set():
            connection: Any = None
            try:
                connection = locks.liveness_connection(self.using)
                connection.ensure_connection()
                if locks.take(connection, self.token):
                    self._set_held(True)
                    if said:
                        logger.info("liveness lock taken again")
                    pause, said = RECONNECT_FIRST, False
                    self._hold(connection)
                elif not said:
                    # The previous session of this process, not yet ended by the server
                    # (a half-open connection): it still says the worker lives.
                    said = True
                    logger.info("liveness lock still held by this worker's previous session; "
                                "taking it again once the server ends that session")
            except Exception as exc:  # noqa: BLE001 - the lease still protects the worker
                if not self._stopping.is_set() and not said:
                    said = True
                    logger.warning("liveness connection lost, reopening (other workers may take "
                                   "this worker's partitions meanwhile) error=%s: %s",
                                   type(exc).__name__, loggable(exc, 300))
            finally:
                self._set_held(False)
                if connection is not None:
                    with contextlib.suppress(Exception):
                        connection.close()
            if self._stopping.wait(pause):
                break
            pause = min(pause * 2, RECONNECT_MOST)

    def _hold(self, connection: Any) -> None:
        """Wait on the connection's socket until stopped; return (releasing the lock) or
        raise when the session no longer holds it."""
        fd = connection.connection.fileno()
        while True:
            readable, _, _ = select.select([fd, self._wake_read], [], [], CHECK_INTERVAL)
            if self._stopping.is_set():
                with contextlib.suppress(Exception):
                    locks.release(connection, self.token)
                return
            # Readable: the server ended the session (the check raises), or sent a notice.
            if not locks.holds(connection, self.token):
                raise RuntimeError("the liveness session no longer holds its lock")
            if readable:
                self._stopping.wait(READABLE_PAUSE)
