"""Before ``manage.py migrate``: the worker, ``manage.py sqlqueue`` and the admin say so in
one line naming ``manage.py migrate``, never with a traceback.

Two databases: an empty one (no table of this app at all) and the test database with this
app's last migration unapplied (a deploy that forgot ``migrate``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse

from tests import launcher_client
from tests.worker_harness import REPO_ROOT, wait_until, worker_env, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

MIGRATE = "python manage.py migrate"
APP_LABEL = "django_sqlqueue"


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


@contextmanager
def empty_database(tmp_path: Path) -> Iterator[str]:
    """The name of a database on the test server with no table in it."""
    if connection.vendor == "sqlite":
        yield str(tmp_path / "empty.sqlite3")
        return
    name = f"{connection.settings_dict['NAME']}_empty"
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cursor.execute(f"CREATE DATABASE {quoted}")
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")


def run_on(database: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``manage.py <args>`` against ``database`` (a database name, or a SQLite file)."""
    env = {**worker_env(), "SQLQUEUE_TEST_DB_NAME": database}
    return launcher_client.run([sys.executable, "-m", "django", *args], cwd=REPO_ROOT, env=env,
                               timeout=timeout, forkable=False)


def the_migrate_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if MIGRATE in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


@contextmanager
def last_migration_unapplied() -> Iterator[None]:
    """The test database with this app's last migration rolled back, restored after."""
    executor = MigrationExecutor(connection)
    [leaf] = executor.loader.graph.leaf_nodes(APP_LABEL)
    [parent] = [p for p in executor.loader.graph.node_map[leaf].parents if p.key[0] == APP_LABEL]
    executor.migrate([parent.key])
    try:
        yield
    finally:
        MigrationExecutor(connection).migrate([leaf])


# --------------------------------------------------------------------------- an empty database


def test_a_burst_worker_on_an_unmigrated_database_exits_with_one_line(tmp_path):
    with empty_database(tmp_path) as database:
        started = time.monotonic()
        result = run_on(database, "runqueueworker", "--burst", "--topic", "orders")
    line = the_migrate_line(result)
    assert "unapplied migration(s) of django_sqlqueue" in line
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("subcommand", [["stats"], ["health"], ["cancel", "--topic", "orders",
                                                                 "--id", "x"]])
def test_the_cli_on_an_unmigrated_database_exits_with_one_line(tmp_path, subcommand):
    with empty_database(tmp_path) as database:
        result = run_on(database, "sqlqueue", *subcommand)
    line = the_migrate_line(result)
    assert line.startswith("CommandError: ")
    assert result.stderr.strip().splitlines() == [line]


# --------------------------------------------------------------------------- a migration behind


def test_a_worker_waits_for_the_last_migration_then_starts(workers):
    with last_migration_unapplied():
        worker = workers.start("before-migrate", "--topic", "orders", "--group", "billing")
        wait_until(lambda: MIGRATE in worker.stderr, what="the migrate line", watch=[worker])
        time.sleep(2.5)  # it looks again every 2 s, and says so only once a minute
        assert worker.alive
        assert worker.stderr.count(MIGRATE) == 1
        assert "1 unapplied migration(s)" in worker.stderr
        assert "Traceback" not in worker.stderr
    wait_until(lambda: worker.leases() > 0, timeout=30, what="the worker starting after migrate",
               watch=[worker])
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(timeout=20) == 0
    assert "Traceback" not in worker.stderr


def test_a_burst_worker_and_the_cli_refuse_a_database_a_migration_behind():
    with last_migration_unapplied():
        burst = run_on(str(connection.settings_dict["NAME"]), "runqueueworker", "--burst",
                       "--topic", "orders")
        stats = run_on(str(connection.settings_dict["NAME"]), "sqlqueue", "stats")
    assert "1 unapplied migration(s)" in the_migrate_line(burst)
    assert "1 unapplied migration(s)" in the_migrate_line(stats)


def test_the_admin_pages_show_the_line_instead_of_a_server_error(admin_user, monkeypatch):
    from django_sqlqueue.admin import schema_guard

    # A web process started before the migration: it has not found the alias migrated.
    monkeypatch.setattr(schema_guard, "_ready", set())
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    pages = [reverse("admin:django_sqlqueue_queuemessage_changelist"),
             reverse("admin:django_sqlqueue_partition_changelist")]
    with last_migration_unapplied():
        responses = [client.get(page) for page in pages]
    for response in responses:
        assert response.status_code == 503
        assert MIGRATE in response.content.decode()
    assert all(client.get(page).status_code == 200 for page in pages)
