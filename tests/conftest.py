"""Shared pytest configuration for the django-sqlqueue test suite."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests import backends, file_times, launcher_client

# --------------------------------------------------------------------------- hypothesis
#
# Property tests draw their 50 examples from the test's name, so every run (and CI) tries
# the same ones and a failure reproduces. HYPOTHESIS_PROFILE=explore draws new examples, more
# of them, to look for new failures. The database fixture is shared by a test's examples
# on purpose: each example rolls back its own savepoint.

settings.register_profile(
    "repeatable", derandomize=True, database=None, deadline=None, max_examples=50,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "explore", parent=settings.get_profile("repeatable"), derandomize=False, max_examples=500,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

# --------------------------------------------------------------------------- test helpers


def pytest_configure(config: pytest.Config) -> None:
    """The package's pytest plugin (its fixtures), as its ``pytest11`` entry point loads it
    where the package is installed: an environment installed before the plugin existed
    gets it here."""
    from django_sqlqueue.testing import pytest_plugin

    if not config.pluginmanager.is_registered(pytest_plugin):
        config.pluginmanager.register(pytest_plugin, "sqlqueue")


# --------------------------------------------------------------------------- backend check
#
# MariaDB and PostgreSQL runs need a live server. Outside CI an unreachable server
# skips the whole run with a loud notice; with CI=true it is an error.


def pytest_sessionstart(session: pytest.Session) -> None:
    db = backends.default_database()
    reason = backends.unreachable_reason(db)
    if reason is None:
        return
    where = backends.describe(db)
    if backends.is_ci():
        pytest.exit(
            f"{where} is not reachable (CI=true requires every backend): {reason}",
            returncode=2,
        )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    notice = f"SKIPPED: {where} is not reachable: {reason}"
    if reporter is not None:
        reporter.write_line(notice, yellow=True, bold=True)
    else:
        print(notice)
    pytest.exit(f"{where} is not reachable; no tests run", returncode=0)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every Spark test (starting one costs ~8 s), with the
    ``sqlqueue`` data source registered. Skipped, saying why, without the spark extra."""
    from tests.spark_support import start_session

    session = start_session()
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _owed_notifications_sent():
    """Publishing may leave a thread sending owed notifications (PostgreSQL) on a
    connection of its own: ended after each test, or it would hold the test database."""
    yield
    from django_sqlqueue.db import notify

    notify.close()


# --------------------------------------------------------------------------- file times
#
# With SQLQUEUE_TEST_TIMES set (tests/matrix.py sets it for every suite), each test file's
# wall time (setup, call and teardown of its tests) is written there as JSON when the
# session ends: tests/shard.py deals a backend's files into parts by these times.

_FILE_TIMES_PATH = os.environ.get("SQLQUEUE_TEST_TIMES", "")
_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _FILE_TIMES_PATH:
        path = report.nodeid.split("::", 1)[0]
        _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


# --------------------------------------------------------------------------- worker launcher


def pytest_sessionfinish(session: pytest.Session) -> None:
    launcher_client.stop()
    if _FILE_TIMES_PATH:
        file_times.write(_FILE_TIMES_PATH, _file_seconds)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if line := launcher_client.summary():
        terminalreporter.write_line(line)
