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


@pytest.mark.worker
def test_the_demo_adds_up_and_leaves_nothing_outside_the_project(tmp_path: Path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "SQLQUEUE_TEST_SETTINGS")}
    env.update({"DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
                "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(temp)})
    for args in (["migrate", "--noinput"], ["demo"]):
        done = subprocess.run([sys.executable, str(MANAGE), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout

    # Step 8's table: group, worker, handled, failed, keys; its totals are the summary's.
    step = out[out.index("8. Two workers"):out.index("9. The poison order")]
    handled: dict[str, int] = {}
    for line in step.splitlines():
        cells = line.split()
        if cells and cells[0] in ("billing", "emails") and cells[2].isdigit():
            handled[cells[0]] = handled.get(cells[0], 0) + int(cells[2])
    summary = next(line for line in out.splitlines() if line.startswith("Summary:"))
    assert f"billing handled {handled['billing']}," in summary, (step, summary)
    assert f"emails handled {handled['emails']}," in summary, (step, summary)
    # A key under both workers of a group is explained, not left to puzzle over.
    keys = [line.split()[4:] for line in step.splitlines()
            if line.split()[:1] == ["billing"] and line.split()[2].isdigit()]
    if len(keys) == 2 and set(map(str.strip, " ".join(keys[0]).split(","))) & set(
            map(str.strip, " ".join(keys[1]).split(","))):
        assert "under both workers:" in step
    assert list(temp.iterdir()) == [], "the demo left files in the temp directory"


@pytest.mark.worker
def test_the_embedded_demo_handles_orders_in_the_web_process_and_stops_cleanly(tmp_path: Path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "SQLQUEUE_TEST_SETTINGS")}
    env.update({"DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
                "PYTHONPATH": str(REPO_ROOT)})
    for args in (["migrate", "--noinput"], ["demo_embedded"]):
        done = subprocess.run([sys.executable, str(MANAGE), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    pids = next(line for line in out.splitlines() if "handler pids:" in line)
    web_pid = pids.rsplit("the web process: ", 1)[1].rstrip(")")
    assert pids.split("handler pids: ")[1].startswith(f"{web_pid} ("), pids
    assert "leases still held by" in out and ": 0; live heartbeats: 0" in out, out
