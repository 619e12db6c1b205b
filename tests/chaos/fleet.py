"""The processes of a chaos run: workers (one with a skewed clock) and publishers."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import records
from .settings import REPO_ROOT

CLOCK_SKEW = "+60s"  # the skewed worker's wall clock runs a minute ahead
WORKER_CONCURRENCY = 4


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else ""


def base_env(directory: Path, database_url: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.chaos.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env["CHAOS_DIR"] = str(directory)
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


@dataclass
class Worker:
    """A ``runqueueworker`` process slot: restarted under the same name, as a supervisor
    (systemd, a StatefulSet) would do."""

    name: str
    directory: Path
    skewed: bool = False
    database_url: str | None = None  # None: the run's own
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    down_on_purpose: bool = False  # killed or stopped by the run, not by itself
    # start() runs on timer threads while the supervisor checks for exits: without the lock
    # the supervisor could see the old, dead process between start()'s clearing of
    # down_on_purpose and its new process, and start a second one under the same name.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        with self.lock:
            self._start()

    def _start(self) -> None:
        env = base_env(self.directory, self.database_url)
        if self.skewed:
            # Preloaded directly (the faketime wrapper forks, and signals would miss the
            # worker); the monotonic clock stays true, as on a badly synchronised host.
            env.update({"LD_PRELOAD": libfaketime(), "FAKETIME": CLOCK_SKEW,
                        "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
        self.starts += 1
        log = self.directory / f"worker-{self.name}.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "django", "runqueueworker", "--name", self.name,
                 "--concurrency", str(WORKER_CONCURRENCY)],
                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        self.down_on_purpose = False
        records.write("faults", e="start", name=self.name, pid=self.proc.pid, skewed=self.skewed)

    def state(self, wanted: str, timeout: float = 1.0) -> str:
        """The process's state letter in /proc (T: stopped), once it is ``wanted`` or
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                stat = Path(f"/proc/{self.pid}/stat").read_text()
                state = stat.rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return "gone"
            if state == wanted or time.monotonic() > deadline:
                return state
            time.sleep(0.01)

    def signal(self, signum: int) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signum)

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.alive:
            assert self.proc is not None
            self.down_on_purpose = True
            at = time.monotonic()
            self.proc.kill()
            code = self.proc.wait()
            self.exit_codes.append(code)
            # The exit status shows the kill took effect (-9), not a crash just before it.
            records.write("faults", e="kill", name=self.name, pid=self.proc.pid, t=at,
                          dead=time.monotonic(), code=code)

    def stop(self, timeout: float) -> int | None:
        """SIGTERM, then wait; SIGKILL after ``timeout``. The exit code, or None if killed."""
        if self.proc is None:
            return None
        self.down_on_purpose = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        code = self.proc.returncode
        self.exit_codes.append(code)
        return code


    def exited_by_itself(self) -> int | None:
        """The exit status of a worker that ended without the run killing or stopping it,
        once (a supervisor would restart it), or None."""
        with self.lock:
            return self._exited_by_itself()

    def _exited_by_itself(self) -> int | None:
        if self.proc is None or self.down_on_purpose or self.proc.poll() is None:
            return None
        self.down_on_purpose = True
        self.exit_codes.append(self.proc.returncode)
        records.write("faults", e="exited", name=self.name, pid=self.proc.pid,
                      code=self.proc.returncode)
        return self.proc.returncode

    def last_lines(self, count: int = 3) -> str:
        log = self.directory / f"worker-{self.name}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        return " | ".join(line.strip()[:300] for line in lines[-count:])


@dataclass
class Publisher:
    kind: str
    index: int
    proc: subprocess.Popen[bytes]


def start_publisher(kind: str, index: int, seconds: float, seed: int,
                    directory: Path, database_url: str | None = None) -> Publisher:
    log = directory / f"publisher-{kind}-{index}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.publisher", kind, str(index), str(seconds),
             str(seed)],
            cwd=REPO_ROOT, env=base_env(directory, database_url), stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Publisher(kind, index, proc)


def wait_all(publishers: list[Publisher], timeout: float) -> list[int | None]:
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for p in publishers:
        try:
            codes.append(p.proc.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
            codes.append(None)
    return codes
