"""The ``events`` alias of tests/settings_topic_databases.py: a second database for a topic
placed on a database of its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

EVENTS = "events"
NAME_VARIABLE = "SQLQUEUE_TEST_EVENTS_DB_NAME"
# The port of another server of the same engine on this machine holding ``events``.
PORT_VARIABLE = "SQLQUEUE_TEST_EVENTS_PORT"


def events_name(default_name: str, engine: str) -> str:
    """``<name>_events`` beside ``default_name`` (a file ``<stem>_events<suffix>`` on SQLite)."""
    if engine == "django.db.backends.sqlite3":
        path = Path(default_name)
        return str(path.with_name(f"{path.stem}_events{path.suffix}"))
    return f"{default_name}_events"


def events_database(default: dict[str, Any]) -> dict[str, Any]:
    """The ``events`` alias's settings: ``default``'s, with the database named in the
    environment (else beside ``default``'s), on the server at ``PORT_VARIABLE`` if set."""
    name = os.environ.get(NAME_VARIABLE) or events_name(str(default["NAME"]),
                                                         str(default["ENGINE"]))
    config = {**default, "NAME": name, "OPTIONS": dict(default.get("OPTIONS") or {})}
    if port := os.environ.get(PORT_VARIABLE):
        config.update(HOST="127.0.0.1", PORT=int(port))
    config["TEST"] = {**(default.get("TEST") or {}), "NAME": name, "MIRROR": None}
    return config
