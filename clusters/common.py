"""What both clusters need: where they live, running their programs, waiting for them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


class ClusterError(RuntimeError):
    """A cluster could not be started, stopped or failed over; the message says why."""


def base_directory() -> Path:
    """Where the clusters keep their data directories, sockets and logs:
    ``$SQLQUEUE_CLUSTERS_DIR``, or ``.test-data/clusters`` in the checkout."""
    configured = os.environ.get("SQLQUEUE_CLUSTERS_DIR")
    return Path(configured).resolve() if configured else ROOT / ".test-data" / "clusters"


def env_port(name: str, default: int) -> int:
    """A port number from the environment variable ``name``, or ``default``. The defaults
    lie below Linux's ephemeral ports (32768-60999): a port in that range may be taken at
    any moment by the local end of some client's connection, and a server then cannot
    listen on it."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdecimal() or not 1024 <= int(text) <= 65000:
        raise ClusterError(f"{name} must be a port number from 1024 to 65000, got {text!r}")
    return int(text)


def require(path: str, package: str) -> str:
    """``path`` (a program name or an absolute path), or a ClusterError naming the Debian
    package that provides it."""
    found = shutil.which(path) if "/" not in path else (path if Path(path).exists() else None)
    if not found:
        raise ClusterError(f"{path} not found: install Debian's {package} "
                           f"(apt-get install {package}, or run .ci/provision as root)")
    return found


def as_user(user: str, command: Sequence[str]) -> list[str]:
    """``command`` run as ``user`` when this process is root (PostgreSQL refuses to run as
    root), as is otherwise."""
    if os.geteuid() == 0:
        return ["runuser", "-u", user, "--", *command]
    return list(command)


def run(command: Sequence[str], *, timeout: float = 120, check: bool = True,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end; a failure raises ClusterError with its output."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{' '.join(command)} did not finish within {timeout:g} s") from exc
    if check and done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise ClusterError(f"{' '.join(command)} failed with status {done.returncode}:\n{output}")
    return done


def start_detached(command: Sequence[str], log: Path) -> int:
    """Start a server that outlives this process (its own session, its output appended to
    ``log``); return its pid."""
    with log.open("ab") as out:
        proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


def port_open(port: int, host: str = HOST) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def bindable(port: int, host: str = HOST) -> bool:
    """Whether a server could listen on ``port`` now (nothing listens there, and no
    connection uses it as its local end)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ports_free(ports: Sequence[int], variable: str) -> None:
    """Raise ClusterError if one of ``ports`` is taken already (by something else)."""
    taken = [port for port in ports if not bindable(port)]
    if taken:
        raise ClusterError(f"port(s) {', '.join(map(str, taken))} are in use already: stop "
                           f"what listens there, or set {variable} to another port")


def wait_for(what: str, check: Callable[[], bool], timeout: float,
             log: Path | None = None) -> None:
    """Poll ``check`` until it returns True; after ``timeout`` seconds raise ClusterError
    (with the end of ``log``, when given)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = ""
            if log is not None and log.exists():
                tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise ClusterError(f"{what} within {timeout:g} s{tail}")
        time.sleep(0.2)


def read_pid(path: Path) -> int:
    """The pid on the first line of ``path``, or 0."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(path.read_text().split()[0])
    return 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_process(pid: int, timeout: float = 30.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to ``pid`` and wait until it is gone (SIGKILL after ``timeout``)."""
    if not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.05)
    # A child of this process (started by start_detached) is reaped here, not left a zombie.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def reset_directory(path: Path, owner: str | None = None) -> None:
    """An empty ``path``, owned by ``owner`` when this process is root."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    if owner and os.geteuid() == 0:
        shutil.chown(path, owner, owner)
