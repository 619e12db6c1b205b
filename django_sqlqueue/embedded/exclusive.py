"""``PROCESSES = "one"``: of the web processes one server forked, only the one holding a
file lock runs a worker. The operating system releases the lock when its holder exits or
dies, and another process takes it at its next try."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import IO


def lock_path(scope: str, server_pid: int | None = None) -> Path:
    """The lock shared by the processes of one server: named after the process that forked
    them (gunicorn's arbiter, uvicorn's supervisor; by default this process's parent) and
    ``scope``, what they run, so that two projects started by one parent (systemd, a
    shell) never wait for each other."""
    pid = os.getppid() if server_pid is None else server_pid
    digest = hashlib.sha256(scope.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"django-sqlqueue-embedded-{pid}-{digest}.lock"


class ProcessLock:
    """An exclusive, non-blocking ``flock`` on ``path``, held until released or exit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> bool:
        """Take the lock if no other process holds it; True once held."""
        if self._file is not None:
            return True
        import fcntl  # POSIX only, as the servers that fork web processes are

        handle = self.path.open("ab")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._file = handle
        return True

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()  # closing the only descriptor releases the lock
            self._file = None
