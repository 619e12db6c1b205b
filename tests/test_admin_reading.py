"""Which database an admin request reads (django_sqlqueue/admin/reading.py): the read
replica for a page, the queue's database for an action and for the acting session's pages
just after it. The pages themselves are shown reading a real replica in
tests/test_read_replica.py (PostgreSQL)."""

from __future__ import annotations

import time
import warnings

import pytest
from django.conf import settings
from django.test import RequestFactory, override_settings

from django_sqlqueue.admin.reading import PRIMARY_AFTER_ACTION, SESSION_KEY, database_for

REPLICATED = {**settings.DATABASES, "queue": settings.DATABASES["default"],
              "queue_replica": settings.DATABASES["default"]}


@pytest.fixture(autouse=True)
def with_a_replica():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overriding DATABASES warns
        with override_settings(DATABASES=REPLICATED,
                               DATABASE_ROUTERS=["django_sqlqueue.routers.QueueRouter"],
                               SQLQUEUE={**settings.SQLQUEUE, "DATABASE": "queue",
                                         "READ_DATABASE": "queue_replica"}):
            yield


def request(method: str, session: dict[str, float]):  # type: ignore[no-untyped-def]
    made = RequestFactory().generic(method, "/admin/django_sqlqueue/deadletter/")
    made.session = session
    return made


def test_a_page_reads_the_replica():
    assert database_for(request("GET", {})) == "queue_replica"
    assert database_for(request("HEAD", {})) == "queue_replica"


def test_an_action_reads_the_queue_database_and_so_do_the_sessions_next_pages():
    session: dict[str, float] = {}
    assert database_for(request("POST", session)) == "queue"
    assert time.time() < session[SESSION_KEY] <= time.time() + PRIMARY_AFTER_ACTION
    assert database_for(request("GET", session)) == "queue"
    assert database_for(request("GET", {})) == "queue_replica"  # another operator's session


def test_the_pages_read_the_replica_again_once_the_pin_has_run_out():
    session = {SESSION_KEY: time.time() - 1}
    assert database_for(request("GET", session)) == "queue_replica"


def test_without_a_read_database_everything_reads_the_queue_database():
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "READ_DATABASE": None}):
        assert database_for(request("GET", {})) == "queue"
