"""``QueueBackend``: Django's Tasks framework on top of the queue.

``enqueue`` publishes the task's message on the caller's connection: inside
``transaction.atomic`` the task exists only if the block commits. ``runqueueworker`` runs
the task queues and writes the results (see :mod:`django_sqlqueue.tasks.runner`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.checks import CheckMessage
from django.db import connections, transaction
from django.utils import timezone

from ..conf import queue_database
from ..consuming.backoff import Backoff
from ..db import vendor
from ..encoding import MAX_DELAY
from ..exceptions import InvalidMessage
from ..models import QueueMessage, TaskResultRecord
from ..models.fields import MAX_TOPIC_LENGTH
from ..models.task_results import QUEUE_NAME_LENGTH, TASK_PATH_LENGTH
from ..publishing import publish, publish_new, publish_new_many
from ..rows import decode_json, epoch_ms_to_datetime
from .cancelling import TaskCancellation, cancel_task
from .compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .known import resolve
from .options import (
    MAX_TASK_ATTEMPTS,
    TOPIC_PREFIX,
    BackendOptions,
    limits_of,
    queues_by_database,
    topic_for,
    valid_attempts,
    valid_backoff,
)
from .payload import parse as parse_payload
from .results import load_task_path, to_task_result

_QUEUE_RE = re.compile(r"[A-Za-z0-9._-]+")  # the whole name: use fullmatch
MAX_QUEUE_NAME = min(QUEUE_NAME_LENGTH, MAX_TOPIC_LENGTH - len(TOPIC_PREFIX))
# The earliest run_after: due times are stored as milliseconds since the epoch.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class InvalidTaskArguments(InvalidMessage, TypeError):
    """A task's arguments cannot be stored as JSON; nothing was enqueued."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueTask(Task):
    """A Task with per-task retry settings: ``@task(max_attempts=3, backoff=...)`` on
    Django 6.1, which passes extra ``@task`` arguments on to the backend's task class.

    Only this backend's task class takes them: ``task_options()`` works with any backend.
    """

    max_attempts: int | None = None
    backoff: Backoff | None = None


class QueueBackend(BaseTaskBackend):
    """Tasks as messages of the topic ``tasks.<queue>``, run by ``runqueueworker``."""

    task_class = QueueTask
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.queue_options = BackendOptions.from_dict(
            self.options if isinstance(self.options, dict) else {})

    # ----------------------------------------------------------------- Django's API

    def validate_task(self, task: Any) -> None:
        if not self.queue_name_ok(task.queue_name):
            raise InvalidTask(f"queue_name must be 1-{MAX_QUEUE_NAME} characters from "
                              f"[A-Za-z0-9._-], got {task.queue_name!r}")
        super().validate_task(task)
        if task.run_after is not None:
            _check_run_after(task.run_after)
        if len(task.module_path) > TASK_PATH_LENGTH:
            raise InvalidTask(f"the task's module path is over {TASK_PATH_LENGTH} characters")
        attempts = getattr(task, "max_attempts", None)
        if attempts is not None and not valid_attempts(attempts):
            raise InvalidTask(f"max_attempts must be an int from 1 to {MAX_TASK_ATTEMPTS}, "
                              f"got {attempts!r}")
        backoff = getattr(task, "backoff", None)
        if backoff is not None and not valid_backoff(backoff):
            raise InvalidTask(f"backoff must have a delay(attempt) method, got {backoff!r}")

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        return self._enqueue(task, args, kwargs, uuid.uuid4().hex, fresh=True)

    def enqueue_once(self, task: Any, args: Any, kwargs: Any, result_id: str) -> Any:
        """enqueue() under a result id the caller chose: enqueuing the same id again is a
        no-op (the scheduler's "schedule:<name>:<tick>", so a tick runs its task once)."""
        return self._enqueue(task, args, kwargs, result_id, fresh=False)

    def enqueue_many(self, task: Any, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
                     ) -> list[Any]:
        """Enqueue ``task`` once per ``(args, kwargs)`` of ``calls``, in one multi-row
        INSERT per batch (``PUBLISH_BATCH_SIZE`` rows) rather than one per task; all or
        nothing. Inside ``transaction.atomic`` the tasks exist only if the block commits,
        as with ``enqueue()``. Every call is checked before anything is written: a bad one
        raises ``InvalidTaskArguments`` naming its index. Returns the TaskResults in the
        order of ``calls``. ``django_sqlqueue.tasks.enqueue_many(task, calls)`` finds the
        task's backend for you."""
        if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Iterable):
            raise TypeError("calls must be a list of (args, kwargs) pairs, got "
                            f"{type(calls).__name__}")
        topic, alias, delay = self._destination(task)
        prepared = []
        for index, call in enumerate(calls):
            if not (isinstance(call, (tuple, list)) and len(call) == 2):
                raise InvalidTaskArguments(
                    f"{task.module_path}: calls[{index}] must be an (args, kwargs) pair, got "
                    f"{type(call).__name__}")
            try:
                prepared.append(self._message(task, call[0], call[1], uuid.uuid4().hex))
            except InvalidTaskArguments as exc:
                raise InvalidTaskArguments(f"calls[{index}]: {exc}") from exc
        if not prepared:
            return []
        try:
            stored = publish_new_many(topic, [(payload, payload["id"])
                                              for payload, _, _ in prepared],
                                      delay=delay, using=alias)
        except InvalidMessage as exc:
            raise InvalidTaskArguments(f"{task.module_path}: {exc}") from exc
        results = [_ready_result(task, payload["id"], args, kwargs, row.published_at, self.alias)
                   for (payload, args, kwargs), row in zip(prepared, stored, strict=True)]
        transaction.on_commit(lambda: [task_enqueued.send(type(self), task_result=result)
                                       for result in results], using=alias)
        return results

    def _enqueue(self, task: Any, args: Any, kwargs: Any, result_id: str, fresh: bool) -> Any:
        topic, alias, delay = self._destination(task)
        payload, args, kwargs = self._message(task, args, kwargs, result_id)
        try:
            # A new UUID cannot be in the log yet: publish_new skips the duplicate check.
            stored = (publish_new if fresh else publish)(
                topic, payload, id=result_id, delay=delay, using=alias)
        except InvalidMessage as exc:
            raise InvalidTaskArguments(f"{task.module_path}: {exc}") from exc
        result = _ready_result(task, result_id, args, kwargs, stored.published_at, self.alias)
        # Sent once the task exists for the workers: never for a rolled-back enqueue.
        transaction.on_commit(
            lambda: task_enqueued.send(type(self), task_result=result), using=alias)
        return result

    def _destination(self, task: Any) -> tuple[str, str, float]:
        """Check ``task`` can be run by a worker; its topic, the alias of that topic and
        the delay its run_after asks for (by the database's clock)."""
        self.validate_task(task)
        if resolve(task.module_path) is None:
            # A worker would dead-letter it (it runs known tasks only): refused here instead.
            raise InvalidTask(
                f"{task.module_path} is not in an installed app's tasks module nor in a module "
                "of SQLQUEUE['TASK_MODULES'], so no worker would run it (see 'Which tasks "
                "run' in the django-sqlqueue Tasks documentation)")
        if not self.queues:
            # Django's validation accepts any queue name then, but workers run only the
            # queues named. Refused here, not at import, so that the system check
            # (sqlqueue.E056) gets to say what is wrong.
            raise InvalidTask(
                f"TASKS[{self.alias!r}]['QUEUES'] is empty, so no worker would run queue "
                f"{task.queue_name!r}: list the queues of this backend (sqlqueue.E056)")
        topic = topic_for(task.queue_name)
        alias = queue_database(topic)
        delay = _delay_until(task.run_after, alias)
        if delay > MAX_DELAY.total_seconds():  # by the database's clock, this time
            raise _out_of_range(task.run_after)
        return topic, alias, delay

    def _message(self, task: Any, args: Any, kwargs: Any,
                 result_id: str) -> tuple[dict[str, Any], list[Any], dict[str, Any]]:
        """The task message's payload for one call, with its arguments as stored."""
        try:
            args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        except (TypeError, ValueError) as exc:
            raise InvalidTaskArguments(
                f"{task.module_path}: task arguments must be JSON-serializable "
                f"(str, int, float, bool, None, lists and dicts of them): {exc}"
            ) from exc
        try:
            limits = limits_of(task, args, kwargs)
        except (TypeError, LookupError, AttributeError, ValueError) as exc:
            raise InvalidTaskArguments(
                f"{task.module_path}: cannot format its concurrency_key from these arguments: "
                f"{type(exc).__name__}: {exc}") from exc
        run_after = task.run_after.isoformat() if task.run_after is not None else None
        # The message is the task until a worker starts it: that worker writes its result
        # row, in the transaction that hands the task out (see runner.py).
        payload = {"id": result_id, "task": task.module_path, "backend": self.alias,
                   "args": args, "kwargs": kwargs, "priority": task.priority,
                   "run_after": run_after}
        if limits is not None:
            payload["limits"] = limits  # read by the workers (see tasks/limits.py)
        return payload, args, kwargs

    def get_result(self, result_id: str) -> Any:
        """The result row; for a task no worker has started yet, its message. Raises
        TaskResultDoesNotExist for an unknown id, and
        ``django_sqlqueue.tasks.InvalidTaskPayload`` (with the reason) for a waiting
        message no worker can run (written by hand or by another release), which the
        worker dead-letters."""
        result_id = str(result_id)
        message = None
        for alias, queues in queues_by_database(self.queues).items():
            row = TaskResultRecord.objects.using(alias).filter(id=result_id).first()
            if row is not None:
                return to_task_result(row)
            message = QueueMessage.objects.waiting_task([topic_for(q) for q in queues],
                                                        result_id, alias)
            if message is not None:
                break
        if message is None:
            raise TaskResultDoesNotExist(result_id)
        # Checked as the worker checks it: a malformed payload is not a task that will run
        # (the worker dead-letters it), and says why rather than failing on a field.
        payload = parse_payload(decode_json(message.payload), message.topic)
        task = load_task_path(payload.identity.task_path, result_id).using(
            priority=payload.priority, queue_name=message.topic.split(".", 1)[1],
            backend=payload.identity.backend)
        if payload.run_after is not None:
            task = task.using(run_after=payload.run_after)
        return _ready_result(task, result_id, payload.args, payload.kwargs,
                             epoch_ms_to_datetime(message.published_at), payload.identity.backend)

    def cancel(self, result_id: str, *, by: str = "") -> TaskCancellation:
        """Cancel a READY task: it never starts, and its result reads FAILED with a
        ``django_sqlqueue.exceptions.Cancelled`` error. A task already running or finished
        is left as it is (``cancelled`` is False; the result's status says which).
        Raises TaskResultDoesNotExist for an unknown id."""
        return cancel_task(sorted(self.queues), str(result_id), by or f"tasks:{self.alias}")

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """Nothing here: django_sqlqueue's own system checks report this backend's settings
        (``sqlqueue.E050`` …), since Django runs this method only once something imported
        ``django.tasks``."""
        return []

    @staticmethod
    def queue_name_ok(name: Any) -> bool:
        """Whether ``name`` can name a queue (its topic is ``tasks.<name>``)."""
        return (isinstance(name, str) and bool(_QUEUE_RE.fullmatch(name))
                and len(name) <= MAX_QUEUE_NAME)


def _ready_result(task: Any, result_id: str, args: Any, kwargs: Any, enqueued_at: datetime,
                  backend: str) -> Any:
    return TaskResult(
        task=task, id=result_id, status=TaskResultStatus.READY, enqueued_at=enqueued_at,
        started_at=None, finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
        backend=backend, errors=[], worker_ids=[],
    )


def _out_of_range(run_after: Any) -> InvalidTask:
    return InvalidTask(f"run_after must be from 1970-01-01 UTC to at most {MAX_DELAY.days:,} "
                       f"days (1,000 years) ahead, got {run_after!r}")


def _check_run_after(run_after: datetime) -> None:
    """InvalidTask for a run_after the queue cannot hold as a due time (judged by this
    server's clock here; enqueue judges it again by the database's)."""
    try:
        if timezone.is_naive(run_after):  # USE_TZ = False: the current time zone's time
            run_after = timezone.make_aware(run_after)
        ok = run_after >= _EPOCH and run_after - datetime.now(UTC) <= MAX_DELAY
    except (TypeError, ValueError, OverflowError) as exc:
        raise _out_of_range(run_after) from exc
    if not ok:
        raise _out_of_range(run_after)


def _delay_until(run_after: datetime | None, alias: str) -> float:
    """Seconds from the database's clock to ``run_after``: the queue judges due times by
    the database clock, so a web server whose clock runs ahead cannot start a task early."""
    if run_after is None:
        return 0.0
    return max(0.0, run_after.timestamp() - vendor.database_now_ms(connections[alias]) / 1000)


__all__ = ["InvalidTaskArguments", "QueueBackend", "QueueTask", "TaskResult"]
