"""Handlers that misbehave towards the worker itself: they return a value, or close or
end their own database session. Each runs under a real ``runqueueworker``.

A handler module that fails to import is in test_worker_cli.py; a hanging handler in
test_worker_stalls.py.
"""

from __future__ import annotations

import pytest
from django.db import connection

import django_sqlqueue as sqlqueue
from tests.testapp.models import Handled
from tests.worker_harness import partition_heads, partition_watermark, wait_until, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):
    with worker_pool(tmp_path) as pool:
        yield pool


def attempts_by_key(topic: str) -> dict[str, list[int]]:
    runs: dict[str, list[int]] = {}
    for key, attempt in Handled.objects.filter(topic=topic).order_by("attempt").values_list(
            "key", "attempt"):
        runs.setdefault(key, []).append(attempt)
    return runs


def all_acked(topic: str) -> bool:
    """Every partition's watermark of group billing is at its head: everything acked."""
    heads = partition_heads(topic)
    return bool(heads) and all(partition_watermark("billing", topic, partition) == head
                               for partition, head in heads.items())


def test_a_handler_that_returns_a_value_is_acked_with_one_warning_naming_its_subscription(
        workers):
    sqlqueue.publish_many("returning", [
        {"payload": {"return": value}, "key": f"k{n}"}
        for n, value in enumerate([False, "done", {"status": "failed"}, 0])
    ])
    worker = workers.start("returning", "--topic", "returning")

    wait_until(lambda: all_acked("returning"), what="every message acked", watch=[worker])

    assert attempts_by_key("returning") == {f"k{n}": [1] for n in range(4)}
    warnings = [line for line in worker.stderr.splitlines() if "returned a value" in line]
    assert len(warnings) == 1, worker.stderr
    assert "topic=returning group=billing" in warnings[0]
    assert "tests.testapp.queues.returns_a_value" in warnings[0]


def test_a_handler_that_closes_its_connection_midway_is_handled_once(workers):
    sqlqueue.publish_many("severed", [{"payload": {"mode": "close"}, "key": f"k{n}"}
                                      for n in range(6)])
    worker = workers.start("closer", "--topic", "severed", "--concurrency", "1")

    wait_until(lambda: all_acked("severed"), what="every message acked", watch=[worker])

    assert attempts_by_key("severed") == {f"k{n}": [1] for n in range(6)}
    assert "handler failed" not in worker.stderr


def test_a_handler_that_ends_its_own_database_session_is_retried_and_the_worker_carries_on(
        workers):
    # One thread, so the handler after each fault runs on the thread whose session ended.
    sqlqueue.publish_many("severed", [
        {"payload": {"mode": "kill"}, "key": "killed"},
        {"payload": {"mode": "kill-and-return"}, "key": "killed-after-work"},
        *({"payload": {"mode": "none"}, "key": f"other-{n}"} for n in range(6)),
    ])
    worker = workers.start("killer", "--topic", "severed", "--concurrency", "1")

    wait_until(lambda: all_acked("severed"), what="every message acked", watch=[worker])

    assert attempts_by_key("severed") == {
        # Its first attempt could not even record itself; the retry ran on a new session.
        "killed": [2],
        # It finished its work before ending the session: acked, and no later handler of
        # the thread inherited the dead session.
        "killed-after-work": [1],
        **{f"other-{n}": [1] for n in range(6)},
    }
    assert worker.alive
    failures = [line for line in worker.stderr.splitlines() if "handler failed" in line]
    assert len(failures) == 1, worker.stderr
    expected = {"sqlite": "ProgrammingError", "mysql": "OperationalError",
                "postgresql": "OperationalError"}[connection.vendor]
    assert "topic=severed" in failures[0] and f"error={expected}" in failures[0]


def test_keys_and_error_texts_cannot_forge_log_lines(workers):
    worker = workers.start("forger", "--topic", "forged")
    forged = "2026-11-25 00:00:00,000 WARNING django_sqlqueue.worker lease lost group=billing"
    message = sqlqueue.publish("forged", {"forged": forged}, key="key\nlease lost")
    wait_until(lambda: "handler failed, giving up" in worker.stderr, timeout=20,
               what="the failure in the log", watch=[worker])

    lines = worker.stderr.splitlines()
    assert not any(line.startswith(forged[:23]) or line.startswith("lease lost")
                   for line in lines)
    [failure] = [line for line in lines if "handler failed, giving up" in line]
    assert f"offset={message.offset}" in failure
    assert "key=key\\nlease lost" in failure
    assert "\\n" + forged in failure and "\\x1b[2J" in failure
    assert "\x1b" not in worker.stderr


def test_loggable_escapes_what_is_not_printable_and_cuts_long_text():
    from django_sqlqueue.logtext import loggable

    assert loggable("plain text, ünïcode") == "plain text, ünïcode"
    assert loggable("a\nb\r\tc\x00\x1b") == "a\\nb\\r\\tc\\x00\\x1b"
    assert loggable("x" * 600) == "x" * 500 + "…"
