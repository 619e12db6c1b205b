"""The test settings with the queue on a database of its own: the app's tables on the
``queue`` alias, a second database on the suite's server (a second file for SQLite) named
in ``SQLQUEUE_TEST_QUEUE_DB_NAME``, everything else on ``default``, as docs/operating.md
tells a project to set it up. Used by the worker processes and the migrate probe of
tests/test_queue_database.py, which creates that database."""

from __future__ import annotations

import os

from tests.second_database import ALIAS, NAME_VARIABLE, second_database, second_name
from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, SQLQUEUE

_default = DATABASES["default"]
DATABASES = {
    "default": _default,
    ALIAS: second_database(_default, os.environ.get(NAME_VARIABLE)
                           or second_name(str(_default["NAME"]), str(_default["ENGINE"]))),
}
DATABASE_ROUTERS = ["django_sqlqueue.routers.QueueRouter"]
SQLQUEUE = {**SQLQUEUE, "DATABASE": ALIAS}
