"""The pytest plugin of the test helpers: declared as a ``pytest11`` entry point, and safe
to load in any project of the environment (no Django settings, no pytest-django)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from django.db import connection

from tests.settings import REPO_ROOT

PLUGIN = "django_sqlqueue.testing.pytest_plugin"

# Nothing here touches the suite's database: it runs once, in the SQLite suite.
pytestmark = pytest.mark.skipif(connection.vendor != "sqlite",
                                reason="independent of the database; runs in the SQLite suite")


def bare_environment() -> dict[str, str]:
    """This process's environment without Django's settings module."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def test_the_plugin_is_the_package_s_pytest11_entry_point():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"sqlqueue": PLUGIN}


def test_importing_the_plugin_imports_nothing_of_django():
    done = subprocess.run(
        [sys.executable, "-c", f"import sys, {PLUGIN}; print(sorted(m for m in sys.modules "
                               "if m == 'django' or m.startswith('django.')))"],
        env=bare_environment(), capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_the_fixtures_load_in_a_project_without_django_settings_or_pytest_django(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # Registered as the entry point registers it, unless the installed package did already.
    (tmp_path / "conftest.py").write_text(
        f"import {PLUGIN} as plugin\n\n"
        "def pytest_configure(config):\n"
        "    if not config.pluginmanager.is_registered(plugin):\n"
        "        config.pluginmanager.register(plugin, 'sqlqueue')\n"
    )
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider",
         "--fixtures", "-q"],
        cwd=tmp_path, env=bare_environment(), capture_output=True, text=True, timeout=120,
        check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sqlqueue_captured" in done.stdout and "sqlqueue_drain" in done.stdout
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path, env=bare_environment(), capture_output=True, text=True, timeout=120,
        check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
