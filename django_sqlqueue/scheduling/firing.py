"""What a schedule's tick does: publish its message, or enqueue its task, under the id
``schedule:<name>:<tick>``.

Both go through the ordinary paths (``publish()``, the Tasks backend's enqueue) on the
caller's connection, so they commit with the caller's transaction: the scheduler's, which
advances the schedule in the same one. The id makes a second firing of the same tick a
no-op, whatever happens around it.
"""

from __future__ import annotations

from ..conf import get_settings, topic_database
from ..models.schedules import ORIGIN_SETTINGS
from ..publishing import publish
from . import cron
from .spec import ScheduleSpec, known_task_problems

PREFIX = "schedule:"


def tick_id(name: str, tick_ms: int) -> str:
    """The message id of ``name``'s tick at ``tick_ms``: schedule:nightly:2026-03-29T01:00:00Z."""
    return f"{PREFIX}{name}:{cron.tick_label(tick_ms)}"


def manual_id(name: str, now_ms: int) -> str:
    """The message id of a run asked for by an operator (run-now) at ``now_ms``."""
    return f"{PREFIX}{name}:now:{now_ms}"


def not_here(spec: ScheduleSpec, origin: str) -> str:
    """Why this process's release cannot fire ``spec`` (empty when it can): its settings
    do not declare it, or its task cannot be imported or enqueued here (a module or a
    queue another release has). A worker of a release that can fires it instead."""
    declared = get_settings().schedules
    if origin == ORIGIN_SETTINGS and spec.name not in (declared if isinstance(declared, dict)
                                                       else {}):
        return "not declared in this worker's SQLQUEUE['SCHEDULES']"
    if spec.task:
        problems = known_task_problems(spec.task)
        if problems:
            return f"this worker's release cannot run it: {problems[0]}"
    return ""


def fire(spec: ScheduleSpec, message_id: str, using: str) -> None:
    """Publish ``spec``'s message (or enqueue its task) under ``message_id``."""
    definition = spec.definition
    if spec.task:
        from ..tasks.known import resolve_or_raise

        task = resolve_or_raise(spec.task, message_id)  # a row's path is never imported
        backend = task.get_backend()
        backend.enqueue_once(task, definition["args"], definition["kwargs"], message_id)
        return
    # A topic placed on another alias (SQLQUEUE["TOPICS"]) gets its message there, in a
    # transaction of its own: a tick undone after it committed fires again under the same
    # id, which that alias keeps once (as enqueue_once does for tasks).
    topic = definition["topic"]
    publish(topic, definition["payload"], key=definition["key"], id=message_id,
            headers=definition["headers"] or None, using=topic_database(topic) or using)
