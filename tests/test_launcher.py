"""Processes forked by the worker launcher behave as ``python -m django`` started afresh:
the same environment and settings, exit statuses, signals and output.

Each test passes with the launcher and with ``SQLQUEUE_TEST_LAUNCHER=0`` alike.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests import launcher_client
from tests.forked_process import ForkedProcess
from tests.worker_harness import run_manage, wait_until, worker_env, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

OVERRIDES = {"VISIBILITY_TIMEOUT": 7.0, "MAX_ATTEMPTS": 9, "BATCH_SIZE": 3}


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def shell(code: str, **kwargs) -> tuple[int, str, str]:
    """Run ``code`` in ``manage.py shell``: its status, last line of output, and stderr."""
    result = run_manage("shell", "-c", code, **kwargs)
    # Before the code's output, Django 5.2+ may say how many objects it imported.
    last_line = (result.stdout.strip().splitlines() or [""])[-1]
    return result.returncode, last_line, result.stderr


def test_a_command_gets_the_environment_a_subprocess_would():
    code, out, err = shell("import os, json; print(json.dumps(dict(os.environ)))",
                           settings=OVERRIDES)

    assert code == 0, err
    assert json.loads(out) == worker_env(OVERRIDES)


def test_settings_overrides_reach_subscriber_defaults_and_task_backends():
    code, out, err = shell(
        "from django_sqlqueue.consuming.registry import autodiscover, subscriptions\n"
        "from django_sqlqueue.tasks.compat import task_backends\n"
        "autodiscover()\n"
        "s = [s for s in subscriptions() if (s.topic, s.group) == ('orders', 'billing')][0]\n"
        "o = task_backends['default'].queue_options\n"
        "print(s.visibility_timeout, s.max_attempts, s.batch_size, o.visibility_timeout)",
        settings=OVERRIDES,
    )

    assert code == 0, err
    assert out.split() == ["7.0", "9", "3", "7.0"]


@pytest.mark.parametrize(("statement", "status"), [
    ("pass", 0), ("raise SystemExit(3)", 3), ("raise SystemExit('bye')", 1),
    ("import os; os._exit(5)", 5), ("raise ValueError('boom')", 1),
])
def test_a_command_exits_with_the_status_python_would(statement, status):
    code, _, err = shell(statement)

    assert code == status, err
    if "ValueError" in statement:
        assert err.rstrip().endswith("ValueError: boom")
    if "'bye'" in statement:
        assert err.strip() == "bye"


def test_output_reaches_the_files_and_a_signal_ends_the_process_as_it_would(workers):
    worker = workers.start("signalled", "--topic", "orders")
    wait_until(lambda: "worker started name=signalled" in worker.stderr,
               what="the worker's first log line", watch=[worker])
    if launcher_client.enabled():
        assert isinstance(worker.proc, ForkedProcess)
    assert os.getpgid(worker.pid) == os.getpgrp()  # Ctrl-C reaches it, as a subprocess

    worker.send(signal.SIGKILL)

    assert worker.wait_exit(timeout=10) == -signal.SIGKILL
    worker.send(signal.SIGTERM)  # reaped: nothing is sent, as with Popen
