"""One worker fleet over two MariaDB servers: the server holding ``orders`` stops for 30 s,
and only ``orders`` stalls.

A second ``mariadbd`` (clusters/mariadb.py) on a port of its own holds the ``events``
alias, where tests/settings_topic_databases.py places ``orders``; ``manykeys`` stays on the
suite's server. Two workers serve both topics while a publisher writes to both; the second
server is shut down for 30 s and started again. Every ``manykeys`` message is handled
promptly throughout, a worker started during the outage starts and serves ``manykeys``;
every ``orders`` message whose publish() returned is handled once the server is back.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings
from django.db import connections

import django_sqlqueue as sqlqueue
from clusters.common import base_directory
from clusters.mariadb import MariaDBServer
from django_sqlqueue.models import SubscriberHeartbeat
from tests.testapp.models import Handled
from tests.topic_databases import EVENTS, NAME_VARIABLE, PORT_VARIABLE
from tests.worker_harness import wait_until, worker_pool

pytestmark = [
    pytest.mark.worker,
    pytest.mark.skipif("mysql" not in settings.DATABASES["default"]["ENGINE"],
                       reason="starts a second MariaDB server"),
]

OUTAGE = 30.0  # seconds the second server is down
PUBLISH_EVERY = 0.1  # seconds between messages, per topic
PROMPT = 3.0  # seconds within which a message on the running server is handled
PORT = 23316  # below the ephemeral ports; the benchmark's second server uses 23306
DATABASE = "sqlqueue_events"
ROUTER = "django_sqlqueue.routers.QueueRouter"


@pytest.fixture(scope="module")
def second_server(django_db_setup: Any, django_db_blocker: Any) -> Iterator[MariaDBServer]:
    """A fresh second MariaDB server holding a migrated ``events`` alias."""
    server = MariaDBServer(base_directory() / "mariadb-outage", PORT)
    server.start(fresh=True)
    default = connections["default"].settings_dict
    config = {**default, "HOST": "127.0.0.1", "PORT": PORT, "NAME": DATABASE,
              "OPTIONS": dict(default.get("OPTIONS") or {}),
              "TEST": {**(default.get("TEST") or {}), "NAME": DATABASE, "MIRROR": None}}
    settings.DATABASES[EVENTS] = connections.configure_settings(
        {"default": settings.DATABASES["default"], EVENTS: config})[EVENTS]
    try:
        with django_db_blocker.unblock():
            unserialized = {} if django.VERSION >= (6, 0) else {"serialize": False}
            connections[EVENTS].creation.create_test_db(verbosity=0, autoclobber=True,
                                                        **unserialized)
        yield server
    finally:
        connections[EVENTS].close()
        del connections[EVENTS]
        del settings.DATABASES[EVENTS]
        server.stop()


class Publisher(threading.Thread):
    """Publishes to ``orders`` (second server) and ``manykeys`` (the suite's) every
    PUBLISH_EVERY seconds; remembers what each publish() returned and when."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.published: dict[str, dict[int, float]] = {"orders": {}, "manykeys": {}}
        self.refused = 0  # orders publishes that failed (the server down)

    def run(self) -> None:
        topics = {**settings.SQLQUEUE["TOPICS"], "orders": {"PARTITIONS": 12,
                                                            "DATABASE": EVENTS}}
        from django.test import override_settings

        with override_settings(DATABASE_ROUTERS=[ROUTER],
                               SQLQUEUE={**settings.SQLQUEUE, "TOPICS": topics}):
            n = 0
            while not self.stopping.wait(PUBLISH_EVERY):
                n += 1
                for topic in ("orders", "manykeys"):
                    try:
                        stored = sqlqueue.publish(topic, {"n": n}, key=f"k{n % 7}")
                    except Exception:  # noqa: BLE001 - the stopped server refuses it
                        self.refused += 1
                        with contextlib.suppress(Exception):
                            connections[EVENTS].close()
                        continue
                    self.published[topic][stored.offset] = time.time()
        for alias in ("default", EVENTS):
            connections[alias].close()


def handled_at(topic: str) -> dict[int, float]:
    return dict(Handled.objects.filter(topic=topic, group="bulk" if topic == "manykeys"
                                       else "billing").values_list("offset", "handled_at"))


@pytest.mark.django_db(databases=["default", EVENTS], transaction=True)
def test_a_stopped_server_stalls_only_its_own_topics(second_server: MariaDBServer,
                                                     tmp_path: Path) -> None:
    env = {PORT_VARIABLE: str(PORT), NAME_VARIABLE: DATABASE}
    publisher = Publisher()
    with worker_pool(tmp_path) as pool:
        for name in ("w1", "w2"):
            pool.start(name, "--topic", "orders", "--topic", "manykeys",
                       settings_module="tests.settings_topic_databases", extra_env=env)
        publisher.start()
        try:
            wait_until(lambda: len(handled_at("orders")) >= 20, timeout=60)
            second_server.shutdown()
            down_at = time.time()
            # A worker started during the outage starts, and serves the running server.
            late = pool.start("w3", "--topic", "orders", "--topic", "manykeys",
                              settings_module="tests.settings_topic_databases", extra_env=env)
            time.sleep(OUTAGE)
            assert late.alive, late.describe()
            assert SubscriberHeartbeat.objects.filter(  # a member of the group at home
                subscriber_name="w3", consumer_group="bulk", topic="manykeys",
                deregistered_at=0).exists(), late.describe()
            up_at = time.time()
            second_server.resume()
            connections[EVENTS].close()  # this thread's session ended with the server
            wait_until(lambda: len(handled_at("orders")) > len(
                [t for t in publisher.published["orders"].values() if t < down_at]), timeout=60)
            time.sleep(2)
        finally:
            publisher.stopping.set()
            publisher.join(30)
        published = {topic: dict(offsets) for topic, offsets in publisher.published.items()}
        wait_until(lambda: set(handled_at("orders")) >= set(published["orders"])
                   and set(handled_at("manykeys")) >= set(published["manykeys"]), timeout=90)
        assert all(worker.alive for worker in pool.started), pool.report()

    home, away = handled_at("manykeys"), handled_at("orders")
    during = {offset: at for offset, at in published["manykeys"].items()
              if down_at <= at <= up_at}
    assert len(during) > OUTAGE / PUBLISH_EVERY / 2  # the publisher went on at home
    slowest = max(home[offset] - at for offset, at in during.items())
    assert slowest < PROMPT, f"a manykeys message waited {slowest:.1f}s during the outage"
    assert publisher.refused > 0  # orders really was down
    assert not [o for o, at in away.items() if down_at + 1 < at < up_at]  # nothing ran there
    assert set(away) >= set(published["orders"])  # nothing published before it was lost
