"""A failover cuts every connection: the worker's fair-share count meets it first in its
lease cycle, and must say so in one line, not with a traceback (the chaos run counts
tracebacks as faults the queue did not handle)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from django_sqlqueue.consuming.registry import autodiscover, subscriptions
from django_sqlqueue.worker.leasing import Leasing

from .worker_harness import end_sessions

pytestmark = pytest.mark.django_db(transaction=True)


def session_id() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if connection.vendor == "postgresql"
                       else "SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


def test_a_connection_lost_while_counting_live_workers_is_one_line(caplog):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server session to end")
    autodiscover()
    first = min(subscriptions(), key=lambda s: (s.topic, s.group))
    leasing = Leasing("fair-share-probe", "default", [first], lease_duration=30)
    # One thread, so one connection of its own throughout, as the worker's lease thread.
    with ThreadPoolExecutor(max_workers=1) as thread:
        assert thread.submit(leasing._live_workers, int(time.time() * 1000)).result() is not None
        assert end_sessions([thread.submit(session_id).result()]) == 1
        time.sleep(0.1)
        with caplog.at_level(logging.WARNING, logger="django_sqlqueue.worker"):
            counted = thread.submit(leasing._live_workers, int(time.time() * 1000)).result()
        thread.submit(connections.close_all).result()
    assert counted is None  # no cap this cycle: availability over fairness
    said = [r for r in caplog.records if "fair share unavailable" in r.getMessage()]
    assert len(said) == 1
    assert said[0].exc_info is None, "a lost connection is logged without a traceback"
    assert "error=OperationalError" in said[0].getMessage() \
        or "error=InterfaceError" in said[0].getMessage()
