"""``manage.py runqueueworker`` as a command: start-up errors and signals.

A start-up error must end the process with a non-zero status and say what is wrong in one
readable line on stderr (no traceback).
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

import django_sqlqueue as sqlqueue
from tests.testapp.models import Handled
from tests.worker_harness import run_command, wait_until, worker_pool

pytestmark = pytest.mark.worker


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def the_error_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The one stderr line that names the problem; fails if there is not exactly one."""
    assert result.returncode != 0, f"exited 0\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines()
             if all(needle in line for needle in needles)]
    assert len(lines) == 1, f"expected one line with {needles!r} on stderr:\n{result.stderr}"
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--concurrency", "0"], ["--concurrency", "'0'", "from 1 to 1000"]),
        (["--concurrency", "abc"], ["--concurrency", "'abc'", "whole number"]),
        (["--group", "nosuchgroup"], ["unknown group", "nosuchgroup", "billing"]),
        (["--topic", "nosuchtopic"], ["unknown topic", "nosuchtopic", "orders"]),
        (["--name", "w" * 300], ["--name", "300 characters", "255"]),
    ],
    ids=["concurrency-0", "concurrency-abc", "unknown-group", "unknown-topic", "long-name"],
)
def test_an_invalid_invocation_exits_non_zero_with_one_line_naming_the_problem(args, needles):
    result = run_command(*args, timeout=30)

    line = the_error_line(result, *needles)
    assert result.stderr.strip().splitlines() == [line]  # no usage screen, no traceback


def test_a_queues_module_that_fails_to_import_stops_the_worker_with_one_line():
    result = run_command(settings_module="tests.broken_settings", timeout=30)

    line = the_error_line(result, "ModuleNotFoundError", "tests.brokenapp.renamed_handlers")
    assert line.startswith("CommandError: could not import tests.brokenapp.queues: ")
    assert result.stderr.strip().splitlines() == [line]


@pytest.mark.django_db(transaction=True)
def test_a_second_sigterm_during_a_long_handler_exits_at_once(workers):
    worker = workers.start("twice", "--topic", "slow")
    sqlqueue.publish("slow", {"sleep": 30}, key="k")
    wait_until(lambda: Handled.objects.filter(topic="slow", pid=worker.pid).exists(),
               what="the slow handler running", watch=[worker])

    worker.terminate()
    # The first SIGTERM waits for the running handler (SHUTDOWN_GRACE is 10 s)...
    with pytest.raises(subprocess.TimeoutExpired):
        worker.proc.wait(0.5)
    worker.send(signal.SIGTERM)
    signalled_at = time.monotonic()
    # ...the second one does not.
    assert worker.wait_exit(timeout=5) != 0
    assert time.monotonic() - signalled_at < 2.0
    assert "second signal" in worker.stderr
