"""A task message's payload, checked once: what ``enqueue`` wrote, or why it cannot run.

A tasks topic is a topic like any other: anything may be published to it, and a stored
message may come from another release. The worker reads each payload through
:func:`parse` before its poll cycle uses any of it (limits, result row, the task itself),
so a malformed one ends in the dead-letter topic with a reason a person can read, instead
of failing the cycle, and with it its partition, at every attempt. Whatever ``enqueue``
writes passes: both sides share the bounds (see :mod:`.limits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..consuming.limits import Claim
from ..encoding import MAX_DELAY
from ..exceptions import SQLQueueError
from ..logtext import loggable
from ..models.fields import ID_LENGTH
from ..models.task_results import BACKEND_LENGTH, TASK_PATH_LENGTH
from .compat import task_backends
from .limits import KEY_SCOPE, check_task_max_running, check_task_rate

# Django's bounds of Task.priority (django.tasks.base.TASK_MIN/MAX_PRIORITY).
MIN_PRIORITY, MAX_PRIORITY = -100, 100
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the earliest run_after enqueue accepts
_SHOWN = 80  # characters of a bad value quoted in a reason


@dataclass(frozen=True)
class TaskIdentity:
    """The fields a result row is keyed and labelled by, each storable."""

    id: str
    task_path: str
    backend: str


@dataclass(frozen=True)
class TaskPayload:
    """A task message's payload, every field checked."""

    identity: TaskIdentity
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    run_after: datetime | None
    claim: Claim | None  # the fleet-wide limits it runs under (see .limits)

    @property
    def id(self) -> str:
        return self.identity.id


class InvalidTaskPayload(SQLQueueError):
    """A task message the worker cannot run: it is dead-lettered with this reason. When
    its id, task path and backend can be stored, ``identity`` has them, and the result
    row records the failure too."""

    def __init__(self, reason: str, identity: TaskIdentity | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.identity = identity


def parse(payload: Any, topic: str, backends: Mapping[str, str] | None = None) -> TaskPayload:
    """``payload`` of a message on ``topic`` (``tasks.<queue>``) as a TaskPayload; raises
    InvalidTaskPayload naming the first bad field. ``backends`` maps each queue this
    worker runs to the alias of its backend (None: the alias is not checked)."""
    if not isinstance(payload, dict):
        raise InvalidTaskPayload(f"not a task message: the payload is a {type(payload).__name__}, "
                                 "not an object")
    identity = TaskIdentity(
        id=_name(payload, "id", ID_LENGTH),
        task_path=_name(payload, "task", TASK_PATH_LENGTH),
        backend=_name(payload, "backend", BACKEND_LENGTH),
    )
    try:
        parsed = TaskPayload(
            identity=identity,
            args=_typed(payload, "args", list, []),
            kwargs=_typed(payload, "kwargs", dict, {}),
            priority=_priority(payload.get("priority", 0)),
            run_after=_run_after(payload.get("run_after")),
            claim=_claim(payload.get("limits"), identity.task_path),
        )
        _check_backend(identity.backend, topic, backends)
    except InvalidTaskPayload as exc:
        raise InvalidTaskPayload(exc.reason, identity) from None
    return parsed


def _name(payload: dict[str, Any], field: str, limit: int) -> str:
    value = payload.get(field)
    if field not in payload:
        raise InvalidTaskPayload(f"not a task message: no {field!r} field")
    if not isinstance(value, str) or not value:
        raise InvalidTaskPayload(f"{field!r} must be a non-empty string, got {_show(value)}")
    if len(value) > limit:
        raise InvalidTaskPayload(f"{field!r} is {len(value):,} characters long; the limit is {limit}")
    if "\x00" in value:
        raise InvalidTaskPayload(f"{field!r} contains a NUL character")
    return value


def _typed(payload: dict[str, Any], field: str, kind: type, default: Any) -> Any:
    value = payload.get(field, default)
    if not isinstance(value, kind):
        raise InvalidTaskPayload(f"{field!r} must be a {'list' if kind is list else 'object'}, "
                                 f"got {_show(value)}")
    return value


def _priority(value: Any) -> int:
    if (not isinstance(value, int) or isinstance(value, bool)
            or not MIN_PRIORITY <= value <= MAX_PRIORITY):
        raise InvalidTaskPayload(f"'priority' must be an int from {MIN_PRIORITY} to "
                                 f"{MAX_PRIORITY}, got {_show(value)}")
    return value


def _run_after(value: Any) -> datetime | None:
    if value is None:
        return None
    problem = f"'run_after' must be an ISO 8601 date and time, got {_show(value)}"
    if not isinstance(value, str):
        raise InvalidTaskPayload(problem)
    try:
        moment = datetime.fromisoformat(value)
        # enqueue writes the time as given: naive under USE_TZ = False.
        aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
        in_range = _EPOCH <= aware <= datetime.now(UTC) + MAX_DELAY
    except (ValueError, OverflowError) as exc:
        raise InvalidTaskPayload(problem) from exc
    if not in_range:
        raise InvalidTaskPayload(f"'run_after' must be from 1970-01-01 to at most "
                                 f"{MAX_DELAY.days:,} days ahead, got {_show(value)}")
    return moment


def _claim(limits: Any, task_path: str) -> Claim | None:
    if limits is None:
        return None
    if not isinstance(limits, dict):
        raise InvalidTaskPayload(f"'limits' must be an object, got {_show(limits)}")
    key = limits.get("key") or ""
    if not isinstance(key, str):
        raise InvalidTaskPayload(f"'limits.key' must be a string, got {_show(key)}")
    try:
        running = check_task_max_running(limits.get("max_running"))
        rate = check_task_rate(limits.get("rate"))
    except ValueError as exc:
        raise InvalidTaskPayload(f"'limits': {exc}") from exc
    if running is None and rate is None:
        return None
    return Claim(KEY_SCOPE if key else f"task:{task_path}", key, running, rate)


def _check_backend(alias: str, topic: str, backends: Mapping[str, str] | None) -> None:
    """InvalidTaskPayload unless the backend ``alias`` runs the queue of ``topic``."""
    if backends is None:
        return
    queue = topic.split(".", 1)[-1]
    expected = backends.get(queue)
    if alias == expected:
        return
    if alias not in (task_backends.settings or {}):
        raise InvalidTaskPayload(f"names the task backend {alias!r}, which is not in TASKS")
    raise InvalidTaskPayload(f"names the task backend {alias!r}, which does not run queue "
                             f"{queue!r} (TASKS[{expected!r}] does)")


def _show(value: Any) -> str:
    return f"{type(value).__name__} {loggable(repr(value), _SHOWN)}"
