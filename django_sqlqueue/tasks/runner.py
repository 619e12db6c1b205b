"""Running one task message: the handler of a task queue's subscription.

Each attempt marks the result RUNNING and adds the worker's id; a success stores the return
value (SUCCESSFUL); a failure stores the exception's path and traceback and either asks
for a retry after the task's backoff (READY again) or, on the last attempt, ends FAILED and
sends the message to the dead-letter topic. Signals are sent like Django's own backends
send them: ``task_started`` at each attempt, ``task_finished`` once it is SUCCESSFUL or
FAILED.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import timedelta
from traceback import format_exception
from typing import Any

from django.db import router
from django.utils import timezone
from django.utils.module_loading import import_string

from ..consuming.backoff import retry_delay
from ..consuming.message import Message
from ..exceptions import DeadLetter, Retry, SQLQueueError
from ..logtext import loggable
from ..models import TaskResultRecord
from ..models.task_results import update_locked
from .compat import (
    Task,
    TaskContext,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .options import TaskOptions
from .results import to_task_result

logger = logging.getLogger("django_sqlqueue.tasks")

PRUNE_INTERVAL = 60.0  # seconds between two prunings of old results by one worker


class WorkerLost(SQLQueueError):
    """Recorded as the error of an attempt whose worker stopped before it finished."""


class TaskRunner:
    """Runs the tasks of one worker process (shared by its handler threads)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._next_prune = 0.0
        self._prune_lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        payload = message.payload
        result_id, path, alias = payload["id"], payload["task"], payload["backend"]
        using = router.db_for_write(TaskResultRecord)
        backend: Any = task_backends[alias]
        task = _import_task(path)
        options: TaskOptions = backend.task_options
        max_attempts = getattr(task, "max_attempts", None) or options.max_attempts
        backoff = getattr(task, "backoff", None) or options.backoff
        decision: dict[str, Any] = {}

        def start(row: TaskResultRecord) -> list[str]:
            if row.status == "SUCCESSFUL":
                decision["skip"] = "done"  # a redelivery after the ack was lost
                return []
            if row.status == "FAILED" and row.finished_by_offset == message.offset:
                decision["skip"] = "failed"  # ... or after the dead-lettering was lost
                return []
            if row.status == "RUNNING":
                # The previous attempt's worker stopped before it recorded anything.
                lost = row.worker_ids[-1] if row.worker_ids else "?"
                row.errors.append(_error(WorkerLost(
                    f"worker {lost} stopped during attempt {len(row.worker_ids)} without "
                    "recording an outcome; run again after the visibility timeout")))
            now = timezone.now()
            row.worker_ids.append(self.worker_id)
            row.status = "RUNNING"
            row.started_at = row.started_at or now
            row.last_attempted_at = now
            row.finished_at = None
            row.finished_by_offset = None
            return ["worker_ids", "errors", "status", "started_at", "last_attempted_at",
                    "finished_at", "finished_by_offset"]

        row = update_locked(result_id, using, start)
        if row is None:
            row = _recreate(payload, message, using)
            row = update_locked(result_id, using, start)
            if row is None:
                raise RuntimeError(f"the result row {result_id!r} vanished as it was created")
        if decision.get("skip") == "done":
            return
        if decision.get("skip") == "failed":
            raise DeadLetter(f"{path} failed; its dead-lettering is recorded again")
        if task is None:
            self._finish(result_id, using, path, ImportError(f"{path} is not a task"), final=True)
            raise DeadLetter(f"{path} cannot be imported as a task")
        task = task.using(priority=row.priority, queue_name=row.queue_name, backend=row.backend)
        result = to_task_result(row, task)
        _send(task_started, backend, result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *row.args, **row.kwargs)
            else:
                value = task.call(*row.args, **row.kwargs)
            value = normalize_json(value)
            json.dumps(value, allow_nan=False)
        except BaseException as exc:  # noqa: BLE001 - every failure is recorded on the result
            final = message.attempt >= max_attempts
            finished = self._finish(result_id, using, path, exc, final=final, offset=message.offset)
            if final:
                if finished is not None:
                    _send(task_finished, backend, to_task_result(finished, task))
                raise DeadLetter(f"{type(exc).__name__}: {exc}") from exc
            delay = retry_delay(backoff, message.attempt)
            raise Retry(delay, f"{type(exc).__name__}: {exc}") from exc
        finished = self._succeed(result_id, using, value, message.offset)
        if finished is not None:
            _send(task_finished, backend, to_task_result(finished, task))
        self._maybe_prune(alias, options, using)

    # ----------------------------------------------------------------- steps

    def _succeed(self, result_id: str, using: str, value: Any, offset: int) -> TaskResultRecord | None:
        def change(row: TaskResultRecord) -> list[str]:
            row.status = "SUCCESSFUL"
            row.return_value = value
            row.finished_at = timezone.now()
            row.finished_by_offset = offset
            return ["status", "return_value", "finished_at", "finished_by_offset"]

        return update_locked(result_id, using, change)

    def _finish(self, result_id: str, using: str, path: str, exc: BaseException, *,
                final: bool, offset: int | None = None) -> TaskResultRecord | None:
        """Record a failed attempt: FAILED when it was the last, else READY again."""
        logger.log(logging.WARNING if final else logging.INFO,
                   "task attempt failed id=%s task=%s final=%s error=%s", result_id, path,
                   final, loggable(f"{type(exc).__name__}: {exc}", 300))

        def change(row: TaskResultRecord) -> list[str]:
            row.errors.append(_error(exc))
            row.status = "FAILED" if final else "READY"
            if final:
                row.finished_at = timezone.now()
                row.finished_by_offset = offset
            return ["errors", "status", "finished_at", "finished_by_offset"]

        return update_locked(result_id, using, change)

    def _maybe_prune(self, alias: str, options: TaskOptions, using: str) -> None:
        """Delete this backend's results finished longer than RESULT_RETENTION ago, at most
        once a minute per worker."""
        if options.result_retention is None:
            return
        now = time.monotonic()
        with self._prune_lock:
            if now < self._next_prune:
                return
            self._next_prune = now + PRUNE_INTERVAL
        cutoff = timezone.now() - timedelta(seconds=options.result_retention)
        try:
            deleted = TaskResultRecord.objects.using(using).filter(backend=alias).prune(cutoff)
        except Exception as exc:  # noqa: BLE001 - pruning is housekeeping; the next one retries
            logger.warning("could not prune task results: %s: %s", type(exc).__name__, exc)
            return
        if deleted:
            logger.info("pruned task results backend=%s deleted=%s", alias, deleted)


def _import_task(path: str) -> Any:
    try:
        task = import_string(path)
    except ImportError:
        return None
    return task if isinstance(task, Task) else None


def _recreate(payload: dict[str, Any], message: Message, using: str) -> TaskResultRecord:
    """A message whose result row is gone (pruned, then replayed from the dead letters)
    gets a new one."""
    return TaskResultRecord.objects.using(using).create(
        id=payload["id"], task_path=payload["task"], backend=payload["backend"],
        queue_name=message.topic.split(".", 1)[1], priority=int(payload.get("priority", 0)),
        status="READY", args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
        enqueued_at=message.published_at,
    )


def _error(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    return {"exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
            "traceback": "".join(format_exception(exc))}


def _send(signal: Any, backend: Any, result: Any) -> None:
    """Send a task signal; a failing receiver is logged and does not fail the task."""
    for receiver, response in signal.send_robust(type(backend), task_result=result):
        if isinstance(response, Exception):
            logger.error("task signal receiver %r failed: %s: %s", receiver,
                         type(response).__name__, response)
