"""What a schedule's tick does: publish its message, or enqueue its task, under the id
``schedule:<name>:<tick>``.

Both go through the ordinary paths (``publish()``, the Tasks backend's enqueue) on the
caller's connection, so they commit with the caller's transaction: the scheduler's, which
advances the schedule in the same one. The id makes a second firing of the same tick a
no-op, whatever happens around it.
"""

from __future__ import annotations

from ..publishing import publish
from . import cron
from .spec import ScheduleSpec

PREFIX = "schedule:"


def tick_id(name: str, tick_ms: int) -> str:
    """The message id of ``name``'s tick at ``tick_ms``: schedule:nightly:2026-03-29T01:00:00Z."""
    return f"{PREFIX}{name}:{cron.tick_label(tick_ms)}"


def manual_id(name: str, now_ms: int) -> str:
    """The message id of a run asked for by an operator (run-now) at ``now_ms``."""
    return f"{PREFIX}{name}:now:{now_ms}"


def fire(spec: ScheduleSpec, message_id: str, using: str) -> None:
    """Publish ``spec``'s message (or enqueue its task) under ``message_id``."""
    definition = spec.definition
    if spec.task:
        from ..tasks.known import resolve_or_raise

        task = resolve_or_raise(spec.task, message_id)  # a row's path is never imported
        backend = task.get_backend()
        backend.enqueue_once(task, definition["args"], definition["kwargs"], message_id)
        return
    publish(definition["topic"], definition["payload"], key=definition["key"], id=message_id,
            headers=definition["headers"] or None, using=using)
