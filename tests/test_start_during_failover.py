"""A worker or a ``manage.py sqlqueue`` command that starts while its database fails over
retries its first connection, as the worker retries any later fault; a refusal no retry
cures (bad credentials, an unknown database) ends it at once, in one line.

The failover is a real one as a client sees it: a local port (tests/flaky_port.py) in front
of the test server where nothing listens yet, that accepts connections and closes them (a
proxy with no backend up), that answers as a server not ready for clients (a Galera node not
yet synced: MariaDB error 1047; PostgreSQL starting up: 57P03), then forwards them. SQLite
has no server to fail over: there, a file that cannot be opened ends a worker at once.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, connections

import django_sqlqueue as sqlqueue
from django_sqlqueue.db.errors import is_refusal, is_unreachable
from django_sqlqueue.worker.faults import DatabaseUnreachable, wait_for_database
from django_sqlqueue.worker.scheduling import RETRY_DELAY, Scheduler
from tests.flaky_port import CLOSING, FORWARDING, NOT_READY, flaky_port
from tests.testapp.models import Handled
from tests.worker_harness import REPO_ROOT, run_command, wait_until, worker_env, worker_pool

ENGINE = settings.DATABASES["default"]["ENGINE"]
SCHEMES = {"django.db.backends.mysql": "mysql", "django.db.backends.postgresql": "postgres"}
needs_server = pytest.mark.skipif(ENGINE not in SCHEMES,
                                  reason="SQLite has no server that could fail over")
UP_AFTER = 0.5  # seconds the port answers "not ready" before it forwards
RETRY_LINE = "step=connect transient database error, retrying"


def url(port: int, *, user: str | None = None, password: str | None = None) -> str:
    """A DATABASE_URL for the test server's user on ``port`` of this machine."""
    db = connection.settings_dict
    user = db["USER"] if user is None else user
    password = db["PASSWORD"] if password is None else password
    credentials = quote(user or "", safe="") + (f":{quote(password, safe='')}" if password else "")
    return f"{SCHEMES[ENGINE]}://{credentials}@127.0.0.1:{port}/{db['NAME']}"


def server() -> tuple[str, int, str]:
    """The test server's host and port, and its protocol."""
    db = connection.settings_dict
    scheme = SCHEMES[ENGINE]
    return db["HOST"] or "127.0.0.1", int(db["PORT"] or {"mysql": 3306}.get(scheme, 5432)), scheme


def after(seconds: float, action: Any) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer



def run_sqlqueue(*args: str, extra_env: dict[str, str],
                 timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "django", "sqlqueue", *args], cwd=REPO_ROOT,
                          env={**worker_env(), **extra_env}, capture_output=True, text=True,
                          timeout=timeout, check=False)


# --------------------------------------------------------------------------- which errors


def wrapped(django_error: type[DatabaseError], cause: BaseException) -> DatabaseError:
    """A driver error as Django raises it: wrapped, the driver's error as its cause."""
    exc = django_error(*cause.args)
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(("error", "vendor"), [
    (OSError(errno.EINVAL, "Invalid argument"), "mysql"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "postgresql"),
    (wrapped(OperationalError, Exception(2013, "Lost connection to server at 'handshake'")),
     "mysql"),
    (wrapped(OperationalError, Exception(2003, "Can't connect to server on '127.0.0.1'")),
     "mysql"),
    (wrapped(OperationalError, Exception(2006, "Server has gone away")), "mysql"),
    (wrapped(OperationalError, Exception(1047, "WSREP has not yet prepared node for "
                                                "application use")), "mysql"),
    (wrapped(OperationalError, Exception("connection failed: FATAL:  the database system is "
                                         "starting up")), "postgresql"),
    (wrapped(InterfaceError, Exception("connection already closed")), "postgresql"),
    (wrapped(OperationalError, Exception("database is locked")), "sqlite"),
])
def test_a_failure_to_reach_the_server_is_retried(error, vendor):
    assert is_unreachable(error, vendor)


@pytest.mark.parametrize(("error", "vendor"), [
    (wrapped(OperationalError, Exception(1045, "Access denied for user 'app'@'10.0.0.5'")),
     "mysql"),
    (wrapped(OperationalError, Exception(1044, "Access denied for user 'app' to database 'x'")),
     "mysql"),
    (wrapped(OperationalError, Exception(1049, "Unknown database 'shop'")), "mysql"),
    (wrapped(OperationalError, Exception('connection failed: FATAL:  password authentication '
                                         'failed for user "app"')), "postgresql"),
    (wrapped(OperationalError, Exception('connection failed: FATAL:  database "shop" does not '
                                         'exist')), "postgresql"),
    (wrapped(OperationalError, Exception('connection failed: FATAL:  role "app" does not '
                                         'exist')), "postgresql"),
])
def test_a_refusal_is_not_retried(error, vendor):
    assert is_refusal(error)
    assert not is_unreachable(error, vendor)


def test_a_sqlite_file_that_cannot_be_opened_is_not_retried():
    error = wrapped(OperationalError, Exception("unable to open database file"))
    assert not is_refusal(error)
    assert not is_unreachable(error, "sqlite")


def test_errors_that_are_not_about_reaching_the_database_are_not_retried():
    assert not is_unreachable(ValueError("bad OPTIONS"), "mysql")
    assert not is_unreachable(wrapped(DatabaseError, Exception("syntax error")), "postgresql")


# --------------------------------------------------------------------------- waiting in-process


@pytest.fixture
def flaky_alias(django_db_blocker: Any):
    """An alias ``flaky`` of the test database, reached through a FlakyPort."""
    with flaky_port(*server()) as port:
        config = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": port.port}
        settings.DATABASES["flaky"] = connections.configure_settings(
            {"default": settings.DATABASES["default"], "flaky": config})["flaky"]
        try:
            with django_db_blocker.unblock():
                yield port
        finally:
            connections["flaky"].close()
            del connections["flaky"]
            del settings.DATABASES["flaky"]


@needs_server
def test_the_first_connection_waits_out_a_server_that_is_not_ready(flaky_alias):
    flaky_alias.set(NOT_READY)
    timer = after(UP_AFTER, lambda: flaky_alias.set(FORWARDING))
    lines: list[str] = []
    started = time.monotonic()
    wait_for_database("flaky", report=lines.append)
    took = time.monotonic() - started
    timer.join()
    assert took >= UP_AFTER
    # Every attempt reached the port; the lines about them are at most one a second.
    assert flaky_alias.accepted >= 3
    assert 1 <= len(lines) <= int(took) + 1
    assert RETRY_LINE in lines[0] and "database=flaky" in lines[0]


@needs_server
def test_the_scheduler_retries_a_database_it_cannot_reach(flaky_alias):
    scheduler = Scheduler("flaky")  # started by a worker: its own thread, its own connection
    flaky_alias.set(NOT_READY)
    assert scheduler.step() == RETRY_DELAY
    assert not scheduler.synced
    flaky_alias.set(FORWARDING)
    scheduler.step()
    assert scheduler.synced


@needs_server
def test_a_bounded_wait_gives_up_with_the_last_error(flaky_alias):
    started = time.monotonic()
    with pytest.raises(DatabaseUnreachable, match=r"database 'flaky' unreachable for 0\.[5-9]"):
        wait_for_database("flaky", timeout=0.5, report=lambda line: None)
    assert 0.5 <= time.monotonic() - started < 1.5


# --------------------------------------------------------------------------- processes


@pytest.fixture
def workers(transactional_db: Any, tmp_path: Any):
    with worker_pool(tmp_path) as pool:
        yield pool


@needs_server
@pytest.mark.worker
def test_a_worker_started_during_a_failover_waits_for_it_and_runs(workers):
    stored = sqlqueue.publish("orders", {"n": 1}, key="k")
    with flaky_port(*server()) as port:
        started = time.monotonic()
        worker = workers.start("late", "--burst", "--group", "billing", "--topic", "orders",
                               extra_env={"DATABASE_URL": url(port.port)})
        # Nothing listening, then connections dropped, then a server not ready, then up:
        # each phase lasts until the worker has tried it.
        wait_until(lambda: RETRY_LINE in worker.stderr, what="a first failed try",
                   watch=[worker])
        for mode, tries in ((CLOSING, 1), (NOT_READY, 2)):
            port.set(mode)
            wait_until(lambda tries=tries: port.accepted >= tries, what=f"a try at {mode}",
                       watch=[worker])
        port.set(FORWARDING)
        assert worker.wait_exit(timeout=30) == 0, worker.describe()
        took = time.monotonic() - started
    retries = [line for line in worker.stderr.splitlines() if RETRY_LINE in line]
    assert 1 <= len(retries) <= int(took) + 1  # at most a line a second
    assert list(Handled.objects.values_list("offset", flat=True)) == [stored.offset]


@needs_server
@pytest.mark.django_db
def test_a_command_that_cannot_reach_its_database_exits_1_in_one_line():
    with flaky_port(*server()) as port:
        port.set(CLOSING)
        run = run_sqlqueue("stats", "--wait", "0.5",
                           extra_env={"DATABASE_URL": url(port.port)})
    assert run.returncode == 1, run.stderr
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith("CommandError: database 'default' unreachable for 0.")


@needs_server
@pytest.mark.django_db
def test_a_worker_refused_by_the_server_exits_at_once_in_one_line():
    host, port, _ = server()
    started = time.monotonic()
    # Both at once: each is a process start, and neither may wait.
    refusing = ThreadPoolExecutor(2)
    unknown_db = refusing.submit(run_command, "--burst",
                                 extra_env={"SQLQUEUE_TEST_DB_NAME": "sqlqueue_no_such_db"})
    bad_user = refusing.submit(run_sqlqueue, "stats", extra_env={
        "DATABASE_URL": url(port, user="sqlqueue_nobody", password="wrong")})
    unknown, refused = unknown_db.result(), bad_user.result()
    refusing.shutdown()
    # At once: not after the 30 s a command waits for a server that is down, and not for
    # ever as a worker would. Two interpreter starts take 2-10 s on a loaded machine.
    assert time.monotonic() - started < 25
    for run, says in ((unknown, "sqlqueue_no_such_db"), (refused, "sqlqueue_nobody")):
        assert run.returncode == 1, run.stderr
        assert run.stderr.count("\n") == 1, run.stderr
        assert run.stderr.startswith("CommandError: cannot use database 'default': ")
        assert says in run.stderr


@pytest.mark.skipif(ENGINE != "django.db.backends.sqlite3", reason="SQLite's own case")
def test_a_worker_on_a_sqlite_file_that_cannot_be_opened_exits_at_once(tmp_path):
    run = run_command("--burst", extra_env={
        "SQLQUEUE_TEST_DB_NAME": str(tmp_path / "missing-directory" / "queue.sqlite3")})
    assert run.returncode == 1, run.stderr
    assert run.stderr.count("\n") == 1, run.stderr
    assert "unable to open database file" in run.stderr


@needs_server
@pytest.mark.django_db
def test_a_command_on_a_host_with_a_shifted_clock_waits_instead_of_crashing():
    """libfaketime (the chaos run's skewed worker) makes time.sleep() fail with EINVAL:
    waiting out an unreachable database must not use it."""
    import glob

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("libfaketime is not installed (.ci/provision installs faketime)")
    with flaky_port(*server()) as port:
        port.set(CLOSING)
        run = run_sqlqueue("stats", "--wait", "0.5", extra_env={
            "DATABASE_URL": url(port.port), "LD_PRELOAD": found[0], "FAKETIME": "+60s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    assert run.returncode == 1, run.stderr
    assert "Errno 22" not in run.stderr, run.stderr
    assert run.stderr.startswith("CommandError: database 'default' unreachable for 0."), run.stderr
