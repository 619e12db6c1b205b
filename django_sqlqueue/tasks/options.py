"""A task backend's ``OPTIONS`` and each task's own retry settings, with their defaults,
and the names tasks travel under.

A task queue ``Q`` is the topic ``tasks.Q``, consumed by the consumer group ``tasks``; a
task that fails every attempt lands in ``tasks.Q`` + ``SQLQUEUE["DLQ_SUFFIX"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..conf import MAX_SECONDS, get_settings, is_seconds, queue_database
from ..consuming.backoff import Backoff, ExponentialBackoff
from ..exceptions import ConfigurationError
from ..models.task_results import TASK_GROUP, TASK_TOPIC_PREFIX
from .compat import InvalidTask, Task
from .limits import check_limits, payload_limits

TOPIC_PREFIX = TASK_TOPIC_PREFIX
GROUP = TASK_GROUP
# The most attempts a task may ask for. The queue's subscription allows this many
# deliveries and the task runner decides, per task, when to give up before that.
MAX_TASK_ATTEMPTS = 1000
DEFAULT_RESULT_RETENTION = 7 * 24 * 3600.0  # seconds finished results are kept
# Default backoff: 1 s doubling to 5 minutes, with jitter.
DEFAULT_BACKOFF = ExponentialBackoff(base=1.0, cap=300.0, jitter=True)
KNOWN_OPTIONS = frozenset({"MAX_ATTEMPTS", "BACKOFF", "VISIBILITY_TIMEOUT", "RESULT_RETENTION"})


def topic_for(queue_name: str) -> str:
    return TOPIC_PREFIX + queue_name


def queues_by_database(queues: Iterable[str]) -> dict[str, list[str]]:
    """``queues`` grouped by the alias their topics live on (see conf.queue_database), the
    queue's own alias first: where a task id is looked up, one alias at a time."""
    grouped: dict[str, list[str]] = {queue_database(): []}
    for queue in sorted(queues):
        grouped.setdefault(queue_database(topic_for(queue)), []).append(queue)
    return {alias: names for alias, names in grouped.items() if names}


@dataclass(frozen=True)
class BackendOptions:
    """A ``QueueBackend``'s ``OPTIONS``, defaults filled in."""

    max_attempts: int
    backoff: Backoff
    visibility_timeout: float
    result_retention: float | None

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> BackendOptions:
        """The options with defaults filled in; bad values are reported by ``check()``
        (``sqlqueue.E050`` …) and replaced by defaults here so that checks can run."""
        conf = get_settings()
        attempts = options.get("MAX_ATTEMPTS", conf.max_attempts)
        backoff = options.get("BACKOFF", DEFAULT_BACKOFF)
        timeout = options.get("VISIBILITY_TIMEOUT", conf.visibility_timeout)
        retention = options.get("RESULT_RETENTION", DEFAULT_RESULT_RETENTION)
        return cls(
            max_attempts=attempts if valid_attempts(attempts) else conf.max_attempts,
            backoff=backoff if valid_backoff(backoff) else DEFAULT_BACKOFF,
            visibility_timeout=float(timeout) if is_seconds(timeout) else conf.visibility_timeout,
            result_retention=(float(retention) if is_seconds(retention) else
                              None if retention is None else DEFAULT_RESULT_RETENTION),
        )


def valid_attempts(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and 1 <= value <= MAX_TASK_ATTEMPTS)


def valid_backoff(value: Any) -> bool:
    return callable(getattr(value, "delay", None))


def option_errors(options: Any) -> list[tuple[str, str]]:
    """(check id, message) for each bad value in a backend's ``OPTIONS``."""
    if not isinstance(options, dict):
        return [("sqlqueue.E050", f"OPTIONS must be a dict, got {type(options).__name__}")]
    errors: list[tuple[str, str]] = []
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        errors.append(("sqlqueue.E050", f"unknown OPTIONS {', '.join(sorted(map(repr, unknown)))}; "
                       f"known: {', '.join(sorted(KNOWN_OPTIONS))}"))
    if "MAX_ATTEMPTS" in options and not valid_attempts(options["MAX_ATTEMPTS"]):
        errors.append(("sqlqueue.E051", f"OPTIONS['MAX_ATTEMPTS'] must be an int from 1 to "
                       f"{MAX_TASK_ATTEMPTS}, got {options['MAX_ATTEMPTS']!r}"))
    if "BACKOFF" in options and not valid_backoff(options["BACKOFF"]):
        errors.append(("sqlqueue.E052", "OPTIONS['BACKOFF'] must have a delay(attempt) method, "
                       f"like django_sqlqueue.ExponentialBackoff, got {options['BACKOFF']!r}"))
    if "VISIBILITY_TIMEOUT" in options and not is_seconds(options["VISIBILITY_TIMEOUT"]):
        errors.append(("sqlqueue.E053", f"OPTIONS['VISIBILITY_TIMEOUT'] must be seconds > 0, at "
                       f"most {MAX_SECONDS:.0f}, got {options['VISIBILITY_TIMEOUT']!r}"))
    retention = options.get("RESULT_RETENTION", DEFAULT_RESULT_RETENTION)
    if retention is not None and not is_seconds(retention):
        errors.append(("sqlqueue.E054", f"OPTIONS['RESULT_RETENTION'] must be seconds > 0, at "
                       f"most {MAX_SECONDS:.0f}, or None to keep results, got {retention!r}"))
    return errors


# ------------------------------------------------------------------ per-task settings

class InvalidTaskLimits(ConfigurationError, InvalidTask):
    """``task_options()`` got limits that cannot work (a ValueError and an InvalidTask)."""


_CARRIER = "sqlqueue_task_options"  # the attribute task_options() sets on the function
T = TypeVar("T")


@dataclass(frozen=True)
class PerTaskOptions:
    """What ``task_options()`` attached to a task function; None: the backend's OPTIONS."""

    max_attempts: int | None = None
    backoff: Backoff | None = None
    # Fleet-wide limits, checked: {"max_running", "rate", "concurrency_key"} (see .limits).
    limits: dict[str, Any] | None = None


def task_options(*, max_attempts: int | None = None, backoff: Backoff | None = None,
                 max_running: int | None = None, rate: str | None = None,
                 concurrency_key: str | None = None) -> Callable[[T], T]:
    """Retry settings and limits of one task, read by ``QueueBackend`` and harmless to any
    other backend (Django's ImmediateBackend and DummyBackend ignore them)::

        @task(queue_name="emails")
        @task_options(max_attempts=10, backoff=ExponentialBackoff(base=5, cap=600))
        def sync_invoice(invoice_id): ...

        @task()
        @task_options(concurrency_key="account:{account_id}", max_running=2, rate="10/s")
        def sync_account(account_id): ...

    ``max_running`` and ``rate`` hold across every worker: per value of
    ``concurrency_key`` (formatted from the task's arguments, shared by every task naming
    the same value), else for the task. The settings ride on the function itself, so
    ``@task`` gets a plain function whatever backend is configured. Above ``@task`` it
    works as well. Bad values raise InvalidTask (a ValueError).
    """
    if max_attempts is not None and not valid_attempts(max_attempts):
        raise InvalidTask(f"max_attempts must be an int from 1 to {MAX_TASK_ATTEMPTS}, "
                          f"got {max_attempts!r}")
    if backoff is not None and not valid_backoff(backoff):
        raise InvalidTask(f"backoff must have a delay(attempt) method, got {backoff!r}")

    def attach(target: T) -> T:
        func = target.func if isinstance(target, Task) else target
        if not callable(func):
            raise InvalidTask(f"task_options() decorates a task function, got {target!r}")
        try:
            limits = check_limits(func, max_running, rate, concurrency_key)
        except ValueError as exc:
            raise InvalidTaskLimits(f"task_options(): {exc}") from exc
        setattr(func, _CARRIER, PerTaskOptions(max_attempts=max_attempts, backoff=backoff,
                                               limits=limits))
        return target

    return attach


def limits_of(task: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """What the message of ``task`` called with these arguments carries of its limits."""
    carried = getattr(task.func, _CARRIER, None) or PerTaskOptions()
    return payload_limits(task.func, carried.limits, args, kwargs)


def retry_settings(task: Any, defaults: BackendOptions) -> tuple[int, Backoff]:
    """(max_attempts, backoff) of ``task``: ``@task(max_attempts=...)`` on this backend's
    task class, else ``task_options()``, else the backend's OPTIONS."""
    carried = getattr(task.func, _CARRIER, None) or PerTaskOptions()
    max_attempts = (getattr(task, "max_attempts", None) or carried.max_attempts
                    or defaults.max_attempts)
    backoff = getattr(task, "backoff", None) or carried.backoff or defaults.backoff
    return max_attempts, backoff
