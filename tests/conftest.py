"""Shared pytest configuration for the django-sqlqueue test suite."""

from __future__ import annotations

import pytest

from tests import backends

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
