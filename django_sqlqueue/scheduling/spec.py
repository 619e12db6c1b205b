"""What a schedule is: validated and normalized, from ``SQLQUEUE["SCHEDULES"]`` or the API.

A schedule either enqueues a ``@task`` (``"task"``, with ``"args"`` and ``"kwargs"``) or
publishes a message (``"topic"`` and ``"payload"``, optional ``"key"`` and ``"headers"``),
on the ticks of ``"cron"`` in ``"timezone"`` (UTC by default). The system checks and the
API report the same problems, with the same words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from ..conf import get_settings
from ..encoding import build_row, validate_topic
from ..exceptions import InvalidMessage, SQLQueueError
from ..models.task_results import TASK_PATH_LENGTH
from . import cron

# A schedule's name shows in its message ids, "schedule:<name>:<tick>" (at most 128).
NAME_LENGTH = 90
NAME_RE = re.compile(r"[A-Za-z0-9._-]+")  # the whole name: use fullmatch
MESSAGE_FIELDS = frozenset({"topic", "payload", "key", "headers"})
TASK_FIELDS = frozenset({"task", "args", "kwargs"})
COMMON_FIELDS = frozenset({"cron", "timezone", "catch_up"})
FIELDS = MESSAGE_FIELDS | TASK_FIELDS | COMMON_FIELDS
# Problems found by problems(), as the system checks report them.
E_NAME = "sqlqueue.E090"
E_CRON = "sqlqueue.E091"
E_TIMEZONE = "sqlqueue.E092"
E_CATCH_UP = "sqlqueue.E093"
E_TASK = "sqlqueue.E094"
E_MESSAGE = "sqlqueue.E095"
E_FIELDS = "sqlqueue.E096"


class InvalidSchedule(SQLQueueError, ValueError):
    """A schedule given to ``django_sqlqueue.schedules.add()`` was refused."""


class ScheduleNotFound(SQLQueueError, LookupError):
    """No schedule has this name."""


@dataclass(frozen=True)
class ScheduleSpec:
    """A valid schedule; ``definition`` is its normalized form, stored as JSON."""

    name: str
    cron: str
    timezone: str
    catch_up: str
    definition: dict[str, Any]

    @property
    def task(self) -> str:
        return str(self.definition.get("task", ""))

    @property
    def target(self) -> str:
        """What it fires, for lists: "task shop.tasks.cleanup" or "topic reports"."""
        return f"task {self.task}" if self.task else f"topic {self.definition['topic']}"

    def definition_json(self) -> str:
        return json.dumps(self.definition, sort_keys=True, separators=(",", ":"))


def problems(name: Any, options: Any, *, import_tasks: bool = True) -> list[tuple[str, str]]:
    """Every problem of the schedule ``name`` as (check id, message); empty when valid."""
    found = _name_problems(name)
    if not isinstance(options, dict):
        return found + [(E_FIELDS, f"schedule {name!r} must be a dict, got "
                                   f"{type(options).__name__}")]
    unknown = sorted(map(repr, set(options) - FIELDS))
    if unknown:
        found.append((E_FIELDS, f"schedule {name!r} has unknown key(s) {', '.join(unknown)}; "
                                f"known: {', '.join(sorted(FIELDS))}"))
    try:
        cron.validate(options.get("cron"))  # type: ignore[arg-type]
    except cron.InvalidCron as exc:
        found.append((E_CRON, f"schedule {name!r}: {exc}"))
    timezone = options.get("timezone", "UTC")
    try:
        if not isinstance(timezone, str):
            raise cron.InvalidCron(f"timezone must be a str, got {timezone!r}")
        cron.zone(timezone)
    except cron.InvalidCron as exc:
        found.append((E_TIMEZONE, f"schedule {name!r}: {exc}"))
    catch_up = options.get("catch_up", "latest")
    if catch_up not in cron.CATCH_UP_POLICIES:
        found.append((E_CATCH_UP, f"schedule {name!r}: catch_up must be one of "
                                  f"{', '.join(map(repr, cron.CATCH_UP_POLICIES))}, got "
                                  f"{catch_up!r}"))
    is_task, is_message = "task" in options, "topic" in options
    if is_task == is_message:
        found.append((E_FIELDS, f"schedule {name!r} needs exactly one of 'task' (a @task "
                                "function's dotted path) or 'topic' (to publish a message)"))
    elif is_task:
        found += _task_problems(name, options, import_tasks)
    else:
        found += _message_problems(name, options)
    return found


def normalize(name: Any, options: Any) -> ScheduleSpec:
    """The schedule as stored; InvalidSchedule naming every problem."""
    found = problems(name, options)
    if found:
        raise InvalidSchedule("; ".join(message for _, message in found))
    definition: dict[str, Any] = {
        "cron": " ".join(options["cron"].split()),
        "timezone": options.get("timezone", "UTC"),
        "catch_up": options.get("catch_up", "latest"),
    }
    if "task" in options:
        definition.update(task=options["task"], args=list(options.get("args", [])),
                          kwargs=dict(options.get("kwargs", {})))
    else:
        definition.update(topic=options["topic"], payload=options.get("payload"),
                          key=options.get("key", ""), headers=dict(options.get("headers") or {}))
    return ScheduleSpec(name, definition["cron"], definition["timezone"],
                        definition["catch_up"], definition)


def from_definition(name: str, definition_json: str) -> ScheduleSpec:
    """A stored schedule back as a ScheduleSpec (trusted: it was validated when stored)."""
    definition = json.loads(definition_json)
    return ScheduleSpec(name, definition["cron"], definition["timezone"],
                        definition["catch_up"], definition)


def _name_problems(name: Any) -> list[tuple[str, str]]:
    if isinstance(name, str) and NAME_RE.fullmatch(name) and len(name) <= NAME_LENGTH:
        return []
    return [(E_NAME, f"schedule name {name!r} must be 1-{NAME_LENGTH} characters from "
                     "[A-Za-z0-9._-] (it shows in the ids of the messages it publishes)")]


def _task_problems(name: Any, options: dict[str, Any], import_tasks: bool
                   ) -> list[tuple[str, str]]:
    found = []
    stray = sorted(set(options) & (MESSAGE_FIELDS - {"topic"}))
    if stray:
        found.append((E_FIELDS, f"schedule {name!r} enqueues a task: {', '.join(stray)} "
                                "belong(s) to message schedules"))
    path = options["task"]
    if not isinstance(path, str) or not path or len(path) > TASK_PATH_LENGTH:
        return found + [(E_TASK, f"schedule {name!r}: task must be a @task function's dotted "
                                 f"path, got {path!r}")]
    args, kwargs = options.get("args", []), options.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        found.append((E_TASK, f"schedule {name!r}: args must be a list and kwargs a dict"))
    elif not _is_json(args) or not _is_json(kwargs):
        found.append((E_TASK, f"schedule {name!r}: args and kwargs must be JSON-serializable"))
    if import_tasks:
        found += [(E_TASK, f"schedule {name!r}: {problem}") for problem in task_problems(path)]
    return found


def task_problems(path: str) -> list[str]:
    """Why the task at ``path`` cannot be scheduled: it is not importable, not a task, or
    its backend is not django_sqlqueue's (whose enqueue makes a tick's task exactly once)."""
    try:
        task = import_string(path)
    except Exception as exc:  # noqa: BLE001 - a module missing, or one whose import raises
        # (a @task on a queue these settings lack is refused as its module is imported)
        return [f"task {path!r} cannot be imported ({type(exc).__name__}: {exc})"]
    try:
        from ..tasks.compat import Task
    except ImportError:
        return ["Django's Tasks framework is not installed (Django 5.2 needs django-tasks)"]
    if not isinstance(task, Task):
        return [f"{path!r} is not a @task function"]
    from ..tasks.known import resolve

    if resolve(path) is None:
        return [f"task {path!r} is not in an installed app's tasks module nor in a module of "
                "SQLQUEUE['TASK_MODULES'], so no worker would run it"]
    return backend_problems(task, path)


def known_task_problems(path: str) -> list[str]:
    """:func:`task_problems` for a path read from a row: looked up among the known tasks,
    never imported (a row could name any module)."""
    from ..tasks.known import resolve

    task = resolve(path)
    if task is None:
        return [f"task {path!r} is not a known task of this release (an installed app's "
                "tasks module or SQLQUEUE['TASK_MODULES'])"]
    return backend_problems(task, path)


def backend_problems(task: Any, path: str) -> list[str]:
    """Why the known task ``task`` cannot be enqueued here: its backend or queue."""
    from ..tasks.backend import QueueBackend

    try:
        backend = task.get_backend()
    except Exception as exc:  # noqa: BLE001 - an unknown backend alias, say: reported as is
        return [f"task {path!r} has no usable backend ({exc})"]
    if not isinstance(backend, QueueBackend):
        return [f"task {path!r} runs on {type(backend).__name__}, not "
                "django_sqlqueue.tasks.QueueBackend"]
    if task.queue_name not in backend.queues:
        return [f"task {path!r} uses queue {task.queue_name!r}, which is not in its "
                "backend's QUEUES"]
    return []


def _message_problems(name: Any, options: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    stray = sorted(set(options) & (TASK_FIELDS - {"task"}))
    if stray:
        found.append((E_FIELDS, f"schedule {name!r} publishes a message: {', '.join(stray)} "
                                "belong(s) to task schedules"))
    try:
        validate_topic(options["topic"])
        build_row(options["topic"], options.get("payload"), options.get("key", ""), "x",
                  options.get("headers"), None, get_settings().max_payload_bytes)
    except InvalidMessage as exc:
        found.append((E_MESSAGE, f"schedule {name!r}: {exc}"))
    return found


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
