"""A worker's log reads like one: a start line saying what runs where, one line per
subscription for its leases (partitions as numeric runs), signals by name."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

import django_sqlqueue as sqlqueue
from tests.worker_harness import run_command, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def lines_with(log: str, *needles: str) -> list[str]:
    return [line for line in log.splitlines() if all(n in line for n in needles)]


def test_a_workers_start_and_stop_read_as_a_few_lines(workers):
    worker = workers.start("logged", "--topic", "orders", "--queue", "default",
                           "--concurrency", "3")
    # "orders" has 12 partitions (numeric order: 0-11, not 0,1,10,11,2,...), tasks.default 4.
    wait_until(lambda: worker.leases() == 28, what="all 28 partitions leased", watch=[worker])
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(timeout=20) == 0
    log = worker.stderr

    [start] = lines_with(log, "worker started")
    for part in ("name=logged", "database=default", f"vendor={connection.vendor}",
                 "concurrency=3", "subscriptions=orders:billing,orders:shipping",
                 "queues=default"):
        assert part in start, start
    for group, topic, partitions in (("billing", "orders", "0-11"), ("shipping", "orders", "0-11"),
                                     ("tasks", "tasks.default", "0-3")):
        for what in ("leases acquired", "leases released"):
            assert lines_with(log, what, f"group={group} topic={topic} partitions={partitions} ")
    assert not lines_with(log, "lease acquired"), "one line per lease"
    [received] = lines_with(log, "received SIGTERM")
    assert "10s shutdown grace" in received  # SHUTDOWN_GRACE of the test settings
    assert "again to exit at once" in received
    # Start, 3 + 3 lease lines, the signal, stop: no line per lease of 28.
    assert len(log.strip().splitlines()) <= 12, log


def test_giving_up_names_the_dead_letter_topic():
    sqlqueue.publish("poison", {"n": 1}, key="k")  # always fails; max_attempts=3

    result = run_command("--burst", "--topic", "poison", "--name", "giving-up", timeout=60)

    assert result.returncode == 0, result.stderr
    [line] = lines_with(result.stderr, "giving up")
    assert "dead_letter_topic=poison_dlq" in line
    assert "topic=poison " in line
