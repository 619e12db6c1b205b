"""``runqueueworker --burst``: work until nothing is left to do, then exit at once.

An empty queue ends the run within a poll or two (not a renew interval); a retry waiting
out its backoff is still work of the run, even parked in the database; a message
published with a delay is not, and the last line says how many remain delayed.
"""

from __future__ import annotations

import time

import pytest

import django_sqlqueue as sqlqueue
from tests.testapp.models import Handled
from tests.worker_harness import run_command

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

# The defaults: a run that waited for its next renewal would take RENEW_INTERVAL (10 s).
DEFAULT_TIMING = {"RENEW_INTERVAL": 10.0, "LEASE_DURATION": 30.0, "POLL_INTERVAL": 0.1}


def burst(*args: str) -> tuple[int, float, str]:
    """Run a burst worker to its end: (exit status, seconds taken, its log)."""
    started = time.monotonic()
    result = run_command("--burst", *args, settings=DEFAULT_TIMING, timeout=60)
    elapsed = time.monotonic() - started
    print(f"burst {' '.join(args)}: exit {result.returncode} after {elapsed:.2f}s")
    return result.returncode, elapsed, result.stderr


def test_a_burst_on_an_empty_queue_exits_at_once():
    code, elapsed, log = burst("--topic", "orders", "--name", "empty-burst")

    assert code == 0, log
    assert elapsed < 5.0, log  # measured well under 2 s; RENEW_INTERVAL is 10 s
    assert "burst finished: nothing left to do" in log
    assert "delayed=0" in log


def test_a_burst_waits_out_the_backoff_of_a_retry_and_runs_it():
    # Retried after 3 s: long enough to be parked in the database meanwhile.
    message = sqlqueue.publish("retried", {"retry_in": 3}, key="k")

    code, elapsed, log = burst("--topic", "retried", "--name", "retry-burst")

    assert code == 0, log
    attempts = list(Handled.objects.filter(offset=message.offset).order_by("attempt")
                    .values_list("attempt", flat=True))
    assert attempts == [1, 2], log
    assert elapsed >= 3.0
    assert "delayed=0" in log


def test_a_burst_does_not_wait_for_a_delayed_message_and_says_it_remains():
    later = sqlqueue.publish("orders", {"n": 1}, key="later", delay=600)
    now = sqlqueue.publish("orders", {"n": 2}, key="now")

    code, elapsed, log = burst("--topic", "orders", "--group", "billing", "--name", "delay-burst")

    assert code == 0, log
    assert elapsed < 10.0, log
    assert Handled.objects.filter(offset=now.offset).exists()
    assert not Handled.objects.filter(offset=later.offset).exists()
    [line] = [line for line in log.splitlines() if "burst finished" in line]
    assert "delayed=1" in line
