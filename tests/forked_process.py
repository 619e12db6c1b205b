"""A process the launcher (:mod:`tests.launcher`) forked for this one, waited for and
signalled as a child: the launcher's double fork re-parents it here, a child subreaper.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from typing import Any, Protocol

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


class ProcessHandle(Protocol):
    """What the tests use of a started process: Popen's own interface."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> Any: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class ForkedProcess:
    """A process the launcher forked, re-parented to this one (a child subreaper), so it is
    waited for as a child: Popen's interface and semantics (negative returncode for a
    signal, no signal sent once it has been reaped). For one thread at a time."""

    def __init__(self, args: list[str], pid: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        # Popen's own polling: from half a millisecond, doubling to 50 ms.
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)
        return code

    def send_signal(self, sig: int) -> None:
        # Polled first: once reaped, the pid may belong to another process.
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def become_subreaper() -> None:
    """Orphaned descendants (the launcher's workers) become this process's children."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), ctypes.c_ulong(0),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")
