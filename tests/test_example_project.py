"""The example project's own tests (example_project/shop/tests.py), written with the
queue's test helpers as a project would write them, run by Django's test runner.

They run on SQLite whatever the suite's backend (the example's test database is an
in-memory one); the helpers themselves are tested on every backend in
test_testing_helpers.py and test_testing_testcase.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.settings import REPO_ROOT

MANAGE = REPO_ROOT / "example_project" / "manage.py"

# Nothing here touches the suite's database: it runs once, in the SQLite suite.
pytestmark = pytest.mark.skipif(connection.vendor != "sqlite",
                                reason="independent of the database; runs in the SQLite suite")


def test_the_example_project_s_tests_pass(tmp_path: Path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "SQLQUEUE_TEST_SETTINGS")}
    env.update({"DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
                "PYTHONPATH": str(REPO_ROOT)})

    done = subprocess.run([sys.executable, str(MANAGE), "test", "shop", "--noinput"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stderr
