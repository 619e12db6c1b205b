"""Run real ``manage.py runqueueworker`` processes against the test database.

Worker tests are ``django_db(transaction=True)`` tests: what they publish is committed, so
a worker subprocess (a separate database client) sees it. A worker opens the database that
pytest-django created (``SQLQUEUE_TEST_DB_NAME``) and may override ``SQLQUEUE`` settings
with a JSON object (``SQLQUEUE_TEST_SETTINGS``). Workers are forked by a launcher that has
Django imported already (:mod:`tests.launcher_client`; ``SQLQUEUE_TEST_LAUNCHER=0`` starts
each as a plain subprocess instead).

:func:`worker_pool` hands out a :class:`WorkerPool`; on the way out it stops every worker
still running (SIGTERM, then SIGKILL after a short grace) and prints each worker's output,
which pytest shows when the test failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from django.db import connection

from django_sqlqueue.conf import get_settings
from django_sqlqueue.models import ConsumerOffset, PartitionLease, QueueMessage, Topic
from django_sqlqueue.partitioning import partition_for
from tests import launcher_client
from tests.forked_process import ProcessHandle

REPO_ROOT = Path(__file__).resolve().parent.parent

# Seconds a worker gets to stop after SIGTERM at teardown before it is killed.
TEARDOWN_GRACE = 3.0
# Seconds a test waits for something a worker should do soon (start, handle, rebalance).
DEFAULT_TIMEOUT = 20.0

T = TypeVar("T")


def worker_env(settings: dict[str, Any] | None = None,
               settings_module: str = "tests.settings") -> dict[str, str]:
    """The environment of a worker subprocess: this test database, optional overrides."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings_module
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["SQLQUEUE_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env.pop("SQLQUEUE_TEST_SETTINGS", None)
    if settings:
        env["SQLQUEUE_TEST_SETTINGS"] = json.dumps(settings)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", "runqueueworker", *args]


def forkable(settings_module: str, extra_env: dict[str, str] | None = None) -> bool:
    """Whether the launcher may fork this start: it has the test settings imported, and
    extra variables (an LD_PRELOAD, another DATABASE_URL) act at interpreter start."""
    return settings_module == "tests.settings" and not extra_env


def run_command(*args: str, settings: dict[str, Any] | None = None,
                settings_module: str = "tests.settings",
                timeout: float = 60.0,
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``runqueueworker <args>`` to completion and capture its output (for start-up
    errors, which end the process at once). ``extra_env`` adds environment variables."""
    return launcher_client.run(
        command(*args), cwd=REPO_ROOT,
        env={**worker_env(settings, settings_module), **(extra_env or {})},
        timeout=timeout, forkable=forkable(settings_module, extra_env),
    )


def run_manage(*args: str, settings: dict[str, Any] | None = None,
               timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py <args>`` (any command) against the test database to completion and
    capture its output."""
    return launcher_client.run(
        [sys.executable, "-m", "django", *args], cwd=REPO_ROOT, env=worker_env(settings),
        timeout=timeout,
    )


@dataclass
class WorkerProcess:
    """One running ``runqueueworker`` process and the files its output goes to."""

    name: str
    proc: ProcessHandle  # a subprocess.Popen, or a tests.forked_process.ForkedProcess
    stdout_path: Path
    stderr_path: Path
    started_at: float  # time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def send(self, signum: int) -> None:
        if self.alive:
            self.proc.send_signal(signum)

    def terminate(self) -> None:
        self.send(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, and reap the process."""
        if self.alive:
            self.proc.kill()
        self.proc.wait()

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit; return its exit code or fail with its output."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.name} (pid {self.pid}) still running after {timeout} s\n"
                + self.describe()
            ) from None

    def leases(self) -> int:
        """Partitions this worker holds right now (any group or topic)."""
        return PartitionLease.objects.filter(leased_by=self.name).count()

    def describe(self) -> str:
        state = "running" if self.alive else f"exited with {self.returncode}"
        return (
            f"--- worker {self.name} (pid {self.pid}, {state}) stderr:\n{self.stderr}"
            f"--- worker {self.name} stdout:\n{self.stdout}"
        )


class WorkerPool:
    """Starts workers for one test and stops them all at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[WorkerProcess] = []

    def start(self, name: str, *args: str, settings: dict[str, Any] | None = None,
              settings_module: str = "tests.settings",
              extra_env: dict[str, str] | None = None) -> WorkerProcess:
        """Start ``runqueueworker --name <name> <args>``; it runs until stopped.

        ``extra_env`` adds environment variables (say, to preload libfaketime).
        """
        stdout_path = self.directory / f"{name}.stdout"
        stderr_path = self.directory / f"{name}.stderr"
        env = {**worker_env(settings, settings_module), **(extra_env or {})}
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            proc = launcher_client.start(
                command("--name", name, *args), cwd=REPO_ROOT, env=env, stdout=out, stderr=err,
                forkable=forkable(settings_module, extra_env),
            )
        worker = WorkerProcess(name, proc, stdout_path, stderr_path, time.monotonic())
        self.started.append(worker)
        return worker

    def stop_all(self, grace: float = TEARDOWN_GRACE) -> None:
        """SIGTERM every live worker, SIGKILL those still running after ``grace``."""
        for worker in self.started:
            worker.terminate()
        deadline = time.monotonic() + grace
        for worker in self.started:
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()

    def report(self) -> str:
        return "\n".join(worker.describe() for worker in self.started)


@contextmanager
def worker_pool(directory: Path) -> Iterator[WorkerPool]:
    """Workers for one test, all stopped on the way out; their output is printed then.

    Test modules wrap it in a ``workers`` fixture that also requests ``transactional_db``,
    so the workers are gone before pytest-django empties the tables.
    """
    pool = WorkerPool(directory)
    try:
        yield pool
    finally:
        pool.stop_all()
        # pytest shows a test's captured output only when the test failed.
        print(pool.report())


# --------------------------------------------------------------------------- waiting


def wait_until(predicate: Callable[[], T], timeout: float = DEFAULT_TIMEOUT, *,
               interval: float = 0.05, what: str | None = None,
               watch: Iterable[WorkerProcess] = ()) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Fails with ``what`` and the last value after ``timeout`` seconds, or at once (with the
    output) if a watched worker exits meanwhile.
    """
    watch = list(watch)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for worker in watch:
            if not worker.alive:
                raise AssertionError(
                    f"worker {worker.name} exited with {worker.returncode} while waiting for "
                    f"{what or getattr(predicate, '__name__', 'a condition')}\n{worker.describe()}"
                )
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for "
                f"{what or getattr(predicate, '__name__', 'a condition')}; last value: {value!r}"
            )
        time.sleep(interval)


def wait_stable(read: Callable[[], T], expected: T, hold: float, timeout: float = DEFAULT_TIMEOUT,
                *, interval: float = 0.05, what: str = "a stable state",
                watch: Iterable[WorkerProcess] = ()) -> None:
    """Wait until ``read()`` equals ``expected`` and keeps doing so for ``hold`` seconds."""
    watch = list(watch)
    deadline = time.monotonic() + timeout
    since: float | None = None
    history: list[T] = []
    while True:
        value = read()
        now = time.monotonic()
        if not history or history[-1] != value:
            history.append(value)
        if value == expected:
            since = now if since is None else since
            if now - since >= hold:
                return
        else:
            since = None
        for worker in watch:
            if not worker.alive:
                raise AssertionError(
                    f"worker {worker.name} exited with {worker.returncode} while waiting for "
                    f"{what}\n{worker.describe()}"
                )
        if now >= deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what} = {expected!r} for {hold} s; "
                f"values seen: {history[-10:]!r}"
            )
        time.sleep(interval)


# --------------------------------------------------------------------------- queue state


def partition_of(topic: str, key: str) -> str:
    """The partition ``key`` maps to in ``topic`` (its recorded count, else the setting)."""
    count = Topic.objects.filter(topic=topic).values_list("partitions", flat=True).first()
    return str(partition_for(key, count or get_settings().partitions_for(topic)))


def keys_in_partition(topic: str, partition: str, count: int, prefix: str = "k") -> list[str]:
    """``count`` keys (``<prefix><n>``) that map to ``partition`` of ``topic``."""
    partitions = (Topic.objects.filter(topic=topic).values_list("partitions", flat=True).first()
                  or get_settings().partitions_for(topic))
    keys, n = [], 0
    while len(keys) < count:
        if str(partition_for(f"{prefix}{n}", partitions)) == partition:
            keys.append(f"{prefix}{n}")
        n += 1
    return keys


def watermark(group: str, topic: str, key: str) -> int:
    """The group's watermark (a log position) for the partition ``key`` maps to; 0 before
    it has one. Every message of the key at or below it has been acked."""
    return partition_watermark(group, topic, partition_of(topic, key))


def partition_watermark(group: str, topic: str, partition: str) -> int:
    row = ConsumerOffset.objects.filter(
        consumer_group=group, topic=topic, partition_key=partition
    ).values_list("offset_acked", flat=True).first()
    return int(row or 0)


def partition_heads(topic: str) -> dict[str, int]:
    """{partition: highest position} of the topic's sequenced messages."""
    heads: dict[str, int] = {}
    for key, position in QueueMessage.objects.filter(
        topic=topic, position__isnull=False
    ).values_list("partition_key", "position"):
        heads[key] = max(heads.get(key, 0), position)
    return heads


def position_of(offset: int) -> int | None:
    return QueueMessage.objects.filter(offset=offset).values_list("position", flat=True).first()


def lease_counts(names: Iterable[str]) -> list[int]:
    """Sorted lease counts of the named workers."""
    return sorted(PartitionLease.objects.filter(leased_by=name).count() for name in names)


# --------------------------------------------------------------------------- other sessions


def sessions_waiting_in(table: str) -> list[int]:
    """Ids of other sessions on the test database blocked in an INSERT into ``table``
    (PostgreSQL and MariaDB/MySQL; SQLite has no sessions to list)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' "
                "AND query LIKE %s",
                [f"INSERT INTO%{table}%"],
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.PROCESSLIST WHERE db = DATABASE() "
                "AND id <> CONNECTION_ID() AND info LIKE %s",
                [f"INSERT%{table}%"],
            )
        else:
            raise NotImplementedError("SQLite has no other sessions to inspect")
        return [int(row[0]) for row in cursor.fetchall()]


def end_sessions(ids: Iterable[int]) -> int:
    """Kill the given sessions of the test database; return how many were ended."""
    ended = 0
    with connection.cursor() as cursor:
        for session in ids:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [session])
                ended += bool(cursor.fetchone()[0])
            else:
                try:
                    cursor.execute(f"KILL {int(session)}")
                    ended += 1
                except Exception:  # noqa: BLE001 - it ended by itself meanwhile
                    pass
    return ended


def other_sessions() -> list[int]:
    """Ids of every other session on the test database (the workers' connections)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.PROCESSLIST "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
        else:
            raise NotImplementedError("SQLite has no other sessions to inspect")
        return [int(row[0]) for row in cursor.fetchall()]


def sessions_blocked_updating(table: str) -> int:
    """Other sessions on the test database waiting for a row lock: any on PostgreSQL,
    those stuck in an UPDATE of ``table`` on MariaDB (which reports a lock wait only as a
    long-running statement)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE db = DATABASE() "
                "AND id <> CONNECTION_ID() AND info LIKE %s AND time_ms > 200",
                [f"UPDATE%{table}%"],
            )
        else:
            raise NotImplementedError("SQLite has no other sessions to inspect")
        return int(cursor.fetchone()[0])


def idle_transactions() -> int:
    """Other sessions on the test database with a transaction open and no statement
    running: what a worker frozen inside a transaction leaves (PostgreSQL, MariaDB)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state = 'idle in transaction'"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX t "
                "JOIN information_schema.PROCESSLIST p ON p.id = t.trx_mysql_thread_id "
                "WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID() AND p.command = 'Sleep'"
            )
        else:
            raise NotImplementedError("SQLite has no other sessions to inspect")
        return int(cursor.fetchone()[0])


# --------------------------------------------------------------------------- a late server


class TcpForwarder:
    """Forwards connections from a local port to the database server, once started: until
    then the port refuses connections, as a server that is down does."""

    def __init__(self, target_host: str, target_port: int) -> None:
        import socket

        self.target = (target_host, target_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = int(probe.getsockname()[1])
        probe.close()
        self._listener: Any = None
        self._sockets: list[Any] = []

    def start(self) -> None:
        import socket
        import threading

        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: Any, sink: Any) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(2)

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
