"""Running task messages: the handler of a task queue's subscription, and its hooks.

The worker records a task's result inside its own poll transaction, so the result and
the queue's state always agree:

* as the cycle hands a task out, :meth:`TaskRunner.handed_out` marks its result RUNNING
  and adds the worker's id (creating the row on the first attempt; a row still RUNNING
  means the previous attempt's worker died, which is recorded as that attempt's error);
* a handler thread runs the task (``__call__``) and keeps what happened for the cycle;
* as the cycle records the outcome, :meth:`TaskRunner.recorded` stores it: SUCCESSFUL and
  the return value, or the error and READY again (a retry follows after the backoff) or
  FAILED (the message goes to the dead-letter topic in the same transaction).

Signals are sent like Django's own backends send them: ``task_started`` as each attempt
starts, ``task_finished`` once the task is SUCCESSFUL or FAILED and that is committed
(for a FAILED task, while its exception is being handled, so Django's log receiver logs
its traceback).

A ``KeyboardInterrupt`` raised by a task is not a failure of the task: as in Django's
own backends it goes on up, here to the worker, which stops as on Ctrl-C.

A message whose payload is not a task enqueue could have written (see :mod:`.payload`)
is dead-lettered with the reason, its result row (when its id can be stored) FAILED with
that reason; a return value or error the database cannot store is recorded in a form it
can (see :mod:`.storable`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from traceback import format_exception
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..consuming.backoff import retry_delay
from ..consuming.message import Message
from ..consuming.registry import RecordedOutcome
from ..exceptions import DeadLetter, Retry, SQLQueueError
from ..logtext import loggable
from ..models import TaskResultRecord
from ..models.task_results import (
    Success,
    can_skip_existing,
    copy_row,
    insert_started,
    mark_successful,
    new_row,
)
from .compat import (
    TaskContext,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .known import UnknownTask, resolve
from .options import retry_settings
from .payload import InvalidTaskPayload, TaskIdentity, TaskPayload, parse
from .results import to_task_result
from .retention import ResultPruner
from .storable import storable_return_value, storable_traceback

logger = logging.getLogger("django_sqlqueue.tasks")

Attempt = tuple[str, int, int]  # (topic, offset, attempt) of one delivery


class WorkerLost(SQLQueueError):
    """Recorded as the error of an attempt whose worker stopped before it finished."""


@dataclass(frozen=True, kw_only=True)
class QueueTaskContext(TaskContext):  # type: ignore[misc]  # frozen at run time too
    """The context of a ``takes_context=True`` task. ``attempt`` counts the attempts of
    the current run, 1 to max_attempts: a replay of a FAILED task starts again at 1, while
    ``task_result.attempts`` (its worker ids) counts every attempt, earlier runs included."""

    run_attempt: int

    @property
    def attempt(self) -> int:
        return self.run_attempt


@dataclass
class _Ended:
    """What one attempt did, kept by its handler thread for the poll cycle to record."""

    row: TaskResultRecord  # the result as the attempt started (started_at: its handler's)
    task: Any
    value: Any = None
    size: int = 0  # bytes of the value's JSON
    error: dict[str, str] | None = None
    exception: BaseException | None = None  # what the error was made from
    final: bool = False  # no attempt follows this failed one


class TaskRunner:
    """Runs the tasks of one worker process (shared by its handler threads)."""

    def __init__(self, worker_id: str, aliases: list[str] | None = None,
                 backends: Mapping[str, str] | None = None) -> None:
        self.worker_id = worker_id
        self._backends = backends  # queue name -> the alias of the backend running it
        self._lock = threading.Lock()
        self._started: dict[Attempt, TaskResultRecord | None] = {}  # None: already done
        self._rejected: dict[Attempt, InvalidTaskPayload] = {}  # malformed: dead-lettered
        self._ended: dict[Attempt, _Ended] = {}
        self._pruner = ResultPruner(aliases or [])
        self._stop_worker: Callable[[], None] | None = None

    # ----------------------------------------------------------------- worker hooks

    def started(self, stopping: threading.Event, stop: Callable[[], None], using: str) -> None:
        """The worker started: prune old results on schedule until it stops; ``stop``
        stops it (a task raised KeyboardInterrupt)."""
        self._stop_worker = stop
        self._pruner.start(stopping, using)

    def handed_out(self, messages: list[Message], using: str) -> None:
        """Mark the results RUNNING as their messages are delivered, in the cycle's
        transaction: first attempts inserted RUNNING (one statement, where the database
        can skip the rows that exist), the others in one locking read and an update each.
        Each payload is checked first: a malformed one is only marked, for its handler to
        dead-letter."""
        parsed: list[tuple[Message, TaskPayload | InvalidTaskPayload]] = []
        rejected: dict[Attempt, InvalidTaskPayload] = {}
        started: dict[Attempt, TaskResultRecord | None] = {}
        for message in messages:
            try:
                parsed.append((message, parse(message.payload, message.topic, self._backends)))
            except InvalidTaskPayload as exc:
                rejected[_key(message)] = exc
                if exc.identity is None:
                    started[_key(message)] = None  # no result row to write
                else:
                    parsed.append((message, exc))
        if can_skip_existing(using):
            inserted = self._insert_first_attempts(parsed, started, using)
            parsed = [(m, p) for m, p in parsed if _key(m) not in inserted]
        self._mark_running(parsed, started, using)
        with self._lock:
            self._started.update(started)
            self._rejected.update(rejected)

    def _insert_first_attempts(self, parsed: list[tuple[Message, TaskPayload | InvalidTaskPayload]],
                               started: dict[Attempt, TaskResultRecord | None],
                               using: str) -> set[Attempt]:
        """Insert the RUNNING rows of first attempts whose task has no row yet (almost
        all of them), skipping the rows that exist; return the attempts inserted."""
        # A task handed out twice in one cycle (a duplicate) goes the locking way.
        counts = Counter(_identity(p).id for _, p in parsed)
        once = {task_id for task_id, n in counts.items() if n == 1}
        now = timezone.now()
        rows: list[tuple[Message, TaskResultRecord]] = []
        for message, payload in parsed:
            if message.attempt == 1 and _identity(payload).id in once:
                row = self._new_row(payload, message)
                row.worker_ids.append(self.worker_id)
                row.status = "RUNNING"
                row.started_at = row.last_attempted_at = now
                rows.append((message, row))
        inserted = insert_started([row for _, row in rows], using, skip_existing=True)
        done: set[Attempt] = set()
        for message, row in rows:
            if row.id in inserted:
                started[_key(message)] = _copy(row, started_at=None)
                done.add(_key(message))
        return done

    def _mark_running(self, parsed: list[tuple[Message, TaskPayload | InvalidTaskPayload]],
                      started: dict[Attempt, TaskResultRecord | None], using: str) -> None:
        """Mark the results RUNNING under a lock on their rows: retries, replays, and
        first attempts where the database cannot skip existing rows in an insert."""
        if not parsed:
            return
        ids = sorted({_identity(p).id for _, p in parsed})
        rows = TaskResultRecord.objects.using(using).select_for_update().in_bulk(ids)
        now = timezone.now()
        new: list[TaskResultRecord] = []
        created: set[str] = set()
        for message, payload in parsed:
            identity = _identity(payload)
            row = rows.get(identity.id)
            if row is not None and row.status == "SUCCESSFUL":
                started[_key(message)] = None  # a replayed copy of a finished task
                continue
            if row is None:
                row = rows[identity.id] = self._new_row(payload, message)
                new.append(row)
                created.add(row.id)
            elif row.status == "RUNNING":
                lost = row.worker_ids[-1] if row.worker_ids else "?"
                row.errors.append(_error(WorkerLost(
                    f"worker {lost} stopped during attempt {len(row.worker_ids)} without "
                    "recording an outcome; run again after the visibility timeout")))
            first_start = row.started_at
            row.worker_ids.append(self.worker_id)
            row.status = "RUNNING"
            # Until the handler starts and its outcome is recorded, the hand-out time
            # stands in (the row must say when a RUNNING task started).
            row.started_at = row.started_at or now
            row.last_attempted_at = now
            row.finished_at = None
            if row.id not in created:
                row.save(update_fields=["worker_ids", "errors", "status", "started_at",
                                        "last_attempted_at", "finished_at"], using=using)
            started[_key(message)] = _copy(row, started_at=first_start)
        insert_started(new, using)

    def _new_row(self, payload: TaskPayload | InvalidTaskPayload,
                 message: Message) -> TaskResultRecord:
        """The result row of a first attempt. A malformed payload's row holds only its
        id and task path, under the backend running its queue (whose retention prunes
        it): its other fields are not trusted to be storable."""
        identity = _identity(payload)
        queue = message.topic.split(".", 1)[1]
        if isinstance(payload, TaskPayload):
            return new_row(
                id=identity.id, task_path=identity.task_path, backend=identity.backend,
                queue_name=queue, priority=payload.priority, status="READY",
                args=payload.args, kwargs=payload.kwargs, run_after=payload.run_after,
                enqueued_at=message.published_at, worker_ids=[], errors=[])
        backend = (self._backends or {}).get(queue, identity.backend)
        return new_row(
            id=identity.id, task_path=identity.task_path, backend=backend, queue_name=queue,
            status="READY", enqueued_at=message.published_at, worker_ids=[], errors=[])

    def recorded(self, outcomes: Sequence[RecordedOutcome], using: str) -> None:
        """Store the attempts' outcomes with the cycle that records them; send
        task_finished once that commits."""
        keys = [_key(o.message) for o in outcomes]
        with self._lock:
            ended = [(o, self._ended.get(key)) for o, key in zip(outcomes, keys, strict=True)]
        # Forgotten only once the cycle commits: a cycle that rolls back (a deadlock, say)
        # is tried again with the same outcomes, which must still find what each task did,
        # or their messages would be acked with the results left RUNNING.
        transaction.on_commit(lambda: self._forget(keys), using=using)
        now = timezone.now()
        succeeded = [end for _, end in ended if end is not None and end.error is None]
        failed = [end for _, end in ended if end is not None and end.error is not None]
        finished: list[tuple[TaskResultRecord, Any, BaseException | None]] = []
        timings = ["status", "finished_at", "started_at", "last_attempted_at"]
        if succeeded:
            mark_successful([Success(e.row.id, e.row.started_at, e.row.last_attempted_at,
                                     e.value, e.size) for e in succeeded], now, using)
            finished += [(replace_row(e.row, status="SUCCESSFUL", finished_at=now,
                                      return_value=e.value), e.task, None) for e in succeeded]
        for end in failed:
            row = TaskResultRecord.objects.using(using).select_for_update().get(id=end.row.id)
            row.errors.append(end.error)
            row.status = "FAILED" if end.final else "READY"
            row.finished_at = now if end.final else None
            row.started_at, row.last_attempted_at = end.row.started_at, end.row.last_attempted_at
            row.save(update_fields=["errors", *timings], using=using)
            if end.final:
                finished.append((row, end.task, end.exception))
        if finished:
            transaction.on_commit(lambda: self._announce(finished), using=using)

    def _forget(self, keys: list[Attempt]) -> None:
        with self._lock:
            for key in keys:
                self._ended.pop(key, None)

    def _announce(self, finished: list[tuple[TaskResultRecord, Any, BaseException | None]]) -> None:
        for row, task, exception in finished:
            if task is None:
                continue  # a malformed message or an unknown task path: no Task to announce
            result = to_task_result(row, task)
            backend = task_backends[row.backend]
            if exception is None:
                _send(task_finished, backend, result)
                continue
            # Django's backends send task_finished for a FAILED task from the handler of
            # its exception, and its log receiver logs sys.exc_info(): do the same.
            try:
                raise exception
            except BaseException:  # noqa: BLE001 - re-raised only to be the exception handled
                _send(task_finished, backend, result)

    # ----------------------------------------------------------------- handler

    def __call__(self, message: Message) -> None:
        key = _key(message)
        with self._lock:
            rejected = self._rejected.pop(key, None)
            known = key in self._started
            row = self._started.pop(key, None)
        if rejected is not None:
            if row is not None:  # the result row ends FAILED with the reason
                self._keep(key, _Ended(row, None, error=_error(rejected), exception=rejected,
                                       final=True))
            logger.warning("malformed task message dead-lettered topic=%s offset=%s reason=%s",
                           message.topic, message.offset, loggable(rejected.reason, 300))
            raise DeadLetter(f"malformed task message: {rejected.reason}") from rejected
        if not known:
            try:
                parse(message.payload, message.topic, self._backends)
            except InvalidTaskPayload as exc:
                raise DeadLetter(f"malformed task message: {exc.reason}") from exc
            raise RuntimeError(f"task message at offset {message.offset} was delivered without "
                               "a start record; it is retried")
        if row is None:
            return  # SUCCESSFUL already
        # The attempt starts now (a batch handed out together starts as threads come free).
        start = timezone.now()
        # The snapshot handed_out made is this attempt's own: set its start in place.
        row.started_at, row.last_attempted_at = row.started_at or start, start
        backend: Any = task_backends[row.backend]
        task = _import_task(row.task_path)
        if task is None:
            missing = UnknownTask(f"{row.task_path} is not a known task")
            self._keep(key, _Ended(row, None, error=_error(missing), exception=missing,
                                   final=True))
            raise DeadLetter(f"unknown task path: {loggable(row.task_path, 300)}")
        max_attempts, backoff = retry_settings(task, backend.queue_options)
        if (task.priority, task.queue_name, task.backend) != (row.priority, row.queue_name,
                                                              row.backend):
            task = task.using(priority=row.priority, queue_name=row.queue_name,
                              backend=row.backend)
        if message.attempt > max_attempts:  # its workers kept dying before an outcome
            lost = WorkerLost(f"no attempt left after {message.attempt - 1} deliveries")
            self._keep(key, _Ended(row, task, error=_error(lost), exception=lost, final=True))
            raise DeadLetter(f"{row.task_path}: no attempt left")
        result = to_task_result(row, task)
        _send(task_started, backend, result)
        try:
            if task.takes_context:
                context = QueueTaskContext(task_result=result, run_attempt=message.attempt)
                value = task.call(context, *row.args, **row.kwargs)
            else:
                value = task.call(*row.args, **row.kwargs)
            value = normalize_json(value)
            value, size = storable_return_value(value, json.dumps(value, allow_nan=False))
        except KeyboardInterrupt as exc:
            self._interrupted(key, row, task, exc)
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure is recorded on the result
            final = message.attempt >= max_attempts
            logger.log(logging.WARNING if final else logging.INFO,
                       "task attempt failed id=%s task=%s attempt=%s final=%s error=%s",
                       row.id, row.task_path, message.attempt, final,
                       loggable(f"{type(exc).__name__}: {exc}", 300))
            self._keep(key, _Ended(row, task, error=_error(exc), exception=exc, final=final))
            if final:
                raise DeadLetter(f"{type(exc).__name__}: {exc}") from exc
            raise Retry(retry_delay(backoff, message.attempt), f"{type(exc).__name__}: {exc}") from exc
        self._keep(key, _Ended(row, task, value=value, size=size))

    def _interrupted(self, key: Attempt, row: TaskResultRecord, task: Any,
                     exc: KeyboardInterrupt) -> None:
        """A task raised KeyboardInterrupt: record the attempt (READY: it runs again, never
        FAILED for this) and stop the worker, as Ctrl-C would."""
        logger.warning("task raised KeyboardInterrupt, stopping the worker id=%s task=%s",
                       row.id, row.task_path, exc_info=exc)
        self._keep(key, _Ended(row, task, error=_error(exc), exception=exc))
        if self._stop_worker is not None:
            self._stop_worker()

    def _keep(self, key: Attempt, ended: _Ended) -> None:
        with self._lock:
            self._ended[key] = ended


def _key(message: Message) -> Attempt:
    return (message.topic, message.offset, message.attempt)


def _identity(payload: TaskPayload | InvalidTaskPayload) -> TaskIdentity:
    identity = payload.identity
    assert identity is not None  # noqa: S101 - only malformed payloads with one get here
    return identity


def _copy(row: TaskResultRecord, **changes: Any) -> TaskResultRecord:
    """A snapshot of ``row`` (with ``changes``) that later changes to the row leave alone."""
    return replace_row(row, worker_ids=list(row.worker_ids), errors=list(row.errors), **changes)


replace_row = copy_row  # a copy of a row with some fields changed


def _import_task(path: str) -> Any:
    """The known task at ``path``, or None: a path from a message is never imported."""
    return resolve(path)


def _error(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    return {"exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
            "traceback": storable_traceback("".join(format_exception(exc)))}


def _send(signal: Any, backend: Any, result: Any) -> None:
    """Send a task signal; a failing receiver is logged and does not fail the task."""
    for receiver, response in signal.send_robust(type(backend), task_result=result):
        if isinstance(response, Exception):
            logger.error("task signal receiver %r failed: %s: %s", receiver,
                         type(response).__name__, response)

