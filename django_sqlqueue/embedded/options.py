"""The embedded worker's options: ``SQLQUEUE["EMBEDDED"]`` with keyword arguments over it.

The keys are named like ``runqueueworker``'s options (``GROUP``, ``TOPIC``, ``QUEUE``,
``NAME``, ``CONCURRENCY``; ``SCHEDULES`` is the opposite of ``--no-schedules``), plus what
only a worker inside a web server needs. Read lazily, when the worker starts, so
``override_settings`` and settings loaded after a server's config file both work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..conf import raw_settings
from ..exceptions import ConfigurationError
from ..limits import SUBSCRIBER_NAME_LENGTH

# Mirrors runqueueworker's MAX_CONCURRENCY: each handler thread may hold a connection.
MAX_CONCURRENCY = 1000
PROCESSES = ("every", "one")  # which web processes of one server run a worker
STARTS = ("request", "import")  # when a server without lifespan events starts it
# Django's runserver sets this in the process its autoreloader restarts on every change.
AUTORELOAD_ENV = "RUN_MAIN"

DEFAULTS: dict[str, Any] = {
    "ENABLED": True,
    "GROUP": [],
    "TOPIC": [],
    "QUEUE": [],
    "NAME": None,
    "CONCURRENCY": 4,
    "SCHEDULES": True,
    "PROCESSES": "every",
    "AUTORELOAD": False,
    "START": "request",
}
LISTS = ("GROUP", "TOPIC", "QUEUE")


@dataclass(frozen=True)
class EmbeddedOptions:
    enabled: bool
    group: list[str]
    topic: list[str]
    queue: list[str]
    name: str | None
    concurrency: int
    schedules: bool
    processes: str
    autoreload: bool
    start: str

    def selection(self) -> dict[str, Any]:
        """The options runqueueworker's subscription selection reads."""
        return {"group": self.group, "topic": self.topic, "queue": self.queue}

    def active(self) -> bool:
        """Whether a worker runs in this process: enabled, and not in a process Django's
        autoreloader restarts on every code change unless ``AUTORELOAD`` asks for it."""
        reloading = os.environ.get(AUTORELOAD_ENV) == "true"
        return self.enabled and (self.autoreload or not reloading)


def configured(**overrides: Any) -> dict[str, Any]:
    """``SQLQUEUE["EMBEDDED"]`` over the defaults, then ``overrides`` (lower-case keyword
    names, None meaning "not given") over that, unvalidated."""
    user = raw_settings().get("EMBEDDED") or {}
    values = {**DEFAULTS, **(user if isinstance(user, dict) else {})}
    for keyword, value in overrides.items():
        if value is not None:
            values[keyword.upper()] = value
    for key in LISTS:
        if isinstance(values.get(key), str):  # group="billing": one name, not its letters
            values[key] = [values[key]]
    return values


def problems(values: Any) -> list[str]:
    """What is wrong with an ``EMBEDDED`` dict (merged or as written), one line each."""
    if not isinstance(values, dict):
        return [f"must be a dict, got {type(values).__name__}"]
    errors = []
    unknown = sorted(map(repr, set(values) - set(DEFAULTS)))
    if unknown:
        errors.append(f"has unknown key(s): {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    for key in ("ENABLED", "SCHEDULES", "AUTORELOAD"):
        if key in values and not isinstance(values[key], bool):
            errors.append(f"[{key!r}] must be True or False, got {values[key]!r}")
    for key in LISTS:
        names = values.get(key, [])
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list | tuple) or not all(
                isinstance(n, str) and n.strip() and n.isprintable() for n in names):
            errors.append(f"[{key!r}] must be a list of names, got {values[key]!r}")
    name = values.get("NAME")
    if name is not None and (not isinstance(name, str) or not name.strip()
                             or not name.isprintable() or len(name) > SUBSCRIBER_NAME_LENGTH):
        errors.append(f"['NAME'] must be None or printable text of at most "
                      f"{SUBSCRIBER_NAME_LENGTH} characters, got {name!r}")
    concurrency = values.get("CONCURRENCY", DEFAULTS["CONCURRENCY"])
    if (not isinstance(concurrency, int) or isinstance(concurrency, bool)
            or not 1 <= concurrency <= MAX_CONCURRENCY):
        errors.append(f"['CONCURRENCY'] must be a whole number from 1 to {MAX_CONCURRENCY}, "
                      f"got {concurrency!r}")
    for key, allowed in (("PROCESSES", PROCESSES), ("START", STARTS)):
        if key in values and values[key] not in allowed:
            errors.append(f"[{key!r}] must be one of {', '.join(map(repr, allowed))}, "
                          f"got {values[key]!r}")
    return errors


def embedded_options(**overrides: Any) -> EmbeddedOptions:
    """The options in force: settings, then ``overrides``; a bad value raises
    :class:`~django_sqlqueue.ConfigurationError` saying which."""
    values = configured(**overrides)
    errors = problems(values)
    if errors:
        raise ConfigurationError("embedded worker: " + "; ".join(
            f"SQLQUEUE['EMBEDDED']{e}" if e.startswith("[") else e for e in errors))
    return EmbeddedOptions(**{key.lower(): values[key] for key in DEFAULTS})
