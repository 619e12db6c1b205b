"""A second database on the suite's server (a second file on SQLite), for the tests of
the queue on a database of its own (tests/test_queue_database.py) and their settings
(tests/settings_queue_database.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ALIAS = "queue"
# Workers and the migrate probe open the second database under this name.
NAME_VARIABLE = "SQLQUEUE_TEST_QUEUE_DB_NAME"


def second_name(default_name: str, engine: str) -> str:
    """The second database's name beside ``default_name``: ``<name>_queue`` (a file
    ``<stem>_queue<suffix>`` beside it on SQLite)."""
    if engine == "django.db.backends.sqlite3":
        path = Path(default_name)
        return str(path.with_name(f"{path.stem}_queue{path.suffix}"))
    return f"{default_name}_queue"


def second_database(default: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``default`` alias's settings for the database ``name`` on the same server; the
    test runner creates it under that same name."""
    config = {**default, "NAME": name, "OPTIONS": dict(default.get("OPTIONS") or {})}
    config["TEST"] = {**(default.get("TEST") or {}), "NAME": name, "MIRROR": None}
    return config
