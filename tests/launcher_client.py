"""Start ``python -m django <command>`` processes for the tests: forked by the launcher
(:mod:`tests.launcher`) when it can, else as plain subprocesses.

Each interpreter start costs a worker about a second of CPU for imports and
``django.setup()``; the launcher pays it once per test session and environment. One
launcher runs at a time, for one environment: the interpreter, the directory and every
variable but those a forked worker applies itself (``SQLQUEUE_TEST_SETTINGS``) or nothing
reads at start-up (``PYTEST_CURRENT_TEST``). A start in another environment, the test
database's name included, replaces it.

A plain subprocess is used instead when ``SQLQUEUE_TEST_LAUNCHER=0`` is set (to compare),
off Linux, when the caller says the start cannot be forked (extra environment such as an
``LD_PRELOAD``, another settings module), or when the launcher cannot start or answer
(once it failed to start for an environment, it is not tried again for it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tests.forked_process import ForkedProcess, ProcessHandle, become_subreaper
from tests.launcher import receive, send

ENABLED_VARIABLE = "SQLQUEUE_TEST_LAUNCHER"  # "0": every process a plain subprocess
OVERRIDES_VARIABLE = "SQLQUEUE_TEST_SETTINGS"  # applied by the forked worker itself
# Variables a forked worker gets as they are, but which nothing reads at start-up: they do
# not call for another launcher. pytest names the running test in PYTEST_CURRENT_TEST.
PER_START_VARIABLES = frozenset({OVERRIDES_VARIABLE, "PYTEST_CURRENT_TEST"})
READY_TIMEOUT = 120.0  # seconds the launcher may take to import and set Django up
REPLY_TIMEOUT = 30.0  # seconds a fork may take
STOP_TIMEOUT = 5.0  # seconds the launcher gets to exit once its socket is closed

# What this session started: "forked" and "subprocess" processes, and "launcher"s.
starts: Counter[str] = Counter()


class LauncherUnavailable(Exception):
    """The launcher could not start, or could not fork a worker."""


# --------------------------------------------------------------------------- the launcher


class Launcher:
    """A running ``python -m tests.launcher`` and the socket it serves."""

    def __init__(self, key: tuple[Any, ...], env: dict[str, str], cwd: Path) -> None:
        self.key = key
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - kept until stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.channel = ours
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.launcher", str(theirs.fileno())],
                cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                stderr=self.log, pass_fds=[theirs.fileno()],
            )
        ours.settimeout(READY_TIMEOUT)
        try:
            self._receive()  # {"ready": pid} once Django is set up
        except Exception:
            self.stop()
            raise
        ours.settimeout(REPLY_TIMEOUT)

    def fork(self, args: list[str], env: dict[str, str], cwd: Path, stdio: list[int]) -> int:
        """The pid of a new ``python -m django <args>``, a child of this process."""
        send(self.channel, {"args": args, "env": env, "cwd": str(cwd)}, stdio)
        return int(self._receive()["pid"])

    def _receive(self) -> dict[str, Any]:
        try:
            message, _ = receive(self.channel)
        except (EOFError, OSError) as exc:
            raise LauncherUnavailable(f"the launcher is gone ({exc!r}){self._output()}") from exc
        if "error" in message:
            raise LauncherUnavailable(f"{message['error']}{self._output()}")
        return message

    def _output(self) -> str:
        self.log.seek(0)
        text = self.log.read().decode(errors="replace").strip()
        return f"\nlauncher output:\n{text}" if text else ""

    def stop(self) -> None:
        """Close the socket, on which the launcher exits; kill it if it does not."""
        self.channel.close()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


_launcher: Launcher | None = None
_failed: set[tuple[Any, ...]] = set()  # environments whose launcher could not start


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get(ENABLED_VARIABLE, "1") != "0"


def launcher_for(env: dict[str, str], cwd: Path) -> Launcher | None:
    """The launcher for this environment, started (and the previous one stopped) if need
    be; None when there can be none."""
    global _launcher
    if not enabled():
        return None
    base = {name: value for name, value in env.items() if name != OVERRIDES_VARIABLE}
    key = (sys.executable, str(cwd),
           tuple(sorted(item for item in base.items() if item[0] not in PER_START_VARIABLES)))
    if _launcher is not None and _launcher.key == key:
        return _launcher
    stop()
    if key in _failed:
        return None
    try:
        become_subreaper()
        _launcher = Launcher(key, base, cwd)
        starts["launcher"] += 1
    except (OSError, LauncherUnavailable) as exc:
        _failed.add(key)
        warnings.warn(f"no worker launcher, so every worker starts as a subprocess: {exc}",
                      RuntimeWarning, stacklevel=3)
        return None
    return _launcher


def summary() -> str:
    """One line on how this session's processes were started ("" when none were)."""
    if not (starts["forked"] or starts["subprocess"]):
        return ""
    return (f"django processes: {starts['forked']} forked by {starts['launcher']} launcher(s), "
            f"{starts['subprocess']} started as subprocesses")


def stop() -> None:
    """Stop the launcher (at the end of the test session); workers it forked live on."""
    global _launcher
    if _launcher is not None:
        launcher, _launcher = _launcher, None
        launcher.stop()


# --------------------------------------------------------------------------- starting


def start(args: list[str], *, env: dict[str, str], cwd: Path, stdout: IO[Any], stderr: IO[Any],
          forkable: bool = True) -> ProcessHandle:
    """Start ``args`` (``python -m django ...``) with output to the given files."""
    django_args = _django_args(args)
    launcher = launcher_for(env, cwd) if forkable and django_args is not None else None
    if launcher is not None and django_args is not None:
        try:
            with _stdin() as stdin:
                pid = launcher.fork(django_args, env, cwd,
                                    [stdin, stdout.fileno(), stderr.fileno()])
        except LauncherUnavailable as exc:
            stop()
            warnings.warn(f"the worker launcher failed, starting a subprocess: {exc}",
                          RuntimeWarning, stacklevel=2)
        else:
            starts["forked"] += 1
            return ForkedProcess(args, pid)
    starts["subprocess"] += 1
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr)


def run(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float,
        forkable: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``args`` to completion and capture its output as text, as
    ``subprocess.run(capture_output=True, text=True)`` does."""
    if not (forkable and _django_args(args) is not None and launcher_for(env, cwd)):
        starts["subprocess"] += 1
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    with tempfile.TemporaryDirectory(prefix="sqlqueue-run-") as directory:
        out_path, err_path = Path(directory, "stdout"), Path(directory, "stderr")
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = start(args, env=env, cwd=cwd, stdout=out, stderr=err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise subprocess.TimeoutExpired(args, timeout, _text(out_path),
                                            _text(err_path)) from None
        return subprocess.CompletedProcess(args, code, _text(out_path), _text(err_path))


def _text(path: Path) -> str:
    # The locale's encoding and universal newlines: what text=True decodes with.
    return path.read_text()


def _django_args(args: list[str]) -> list[str] | None:
    """The arguments after ``<this python> -m django``; None for another command."""
    if args[:3] == [sys.executable, "-m", "django"]:
        return args[3:]
    return None


@contextlib.contextmanager
def _stdin() -> Iterator[int]:
    """This process's standard input, which a subprocess would inherit (/dev/null when
    it has none)."""
    try:
        os.fstat(0)
    except OSError:
        with open(os.devnull, "rb") as null:
            yield null.fileno()
    else:
        yield 0
