"""The test settings with a topic on a database of its own: ``orders`` (and its dead
letters) on the ``events`` alias, every other topic on ``default``, as docs/operating.md
("When one server is not enough") tells a project to set it up.

``events`` is a second database on the suite's server (a second file for SQLite) named in
``SQLQUEUE_TEST_EVENTS_DB_NAME``, or on another server when ``SQLQUEUE_TEST_EVENTS_PORT``
gives its port (MariaDB: tests/test_topic_database_outage.py starts one). Used by the
worker processes of tests/test_topic_databases.py and that outage test.
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, SQLQUEUE
from tests.topic_databases import EVENTS, events_database

DATABASES = {"default": DATABASES["default"], EVENTS: events_database(DATABASES["default"])}
DATABASE_ROUTERS = ["django_sqlqueue.routers.QueueRouter"]
SQLQUEUE = {**SQLQUEUE, "TOPICS": {**SQLQUEUE["TOPICS"],  # type: ignore[dict-item]
                                   "orders": {"PARTITIONS": 12, "DATABASE": EVENTS}}}
