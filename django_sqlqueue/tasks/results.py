"""Turning a ``queue_task_results`` row into Django's ``TaskResult``."""

from __future__ import annotations

from typing import Any

from ..models import TaskResultRecord
from .compat import TaskError, TaskResult, TaskResultStatus
from .known import resolve_or_raise


def load_task_path(path: str, result_id: str) -> Any:
    """The known task at ``path`` (never imported from it: see known.py); UnknownTask, a
    TaskResultDoesNotExist, when there is none."""
    return resolve_or_raise(path, result_id)


def load_task(row: TaskResultRecord) -> Any:
    """The Task the row was enqueued from, with the row's queue, priority and run_after."""
    return load_task_path(row.task_path, row.id).using(priority=row.priority, queue_name=row.queue_name,
                      run_after=row.run_after, backend=row.backend)


def to_task_result(row: TaskResultRecord, task: Any = None) -> Any:
    result: Any = TaskResult(
        task=task if task is not None else load_task(row),
        id=row.id,
        status=TaskResultStatus(row.status),
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=row.last_attempted_at,
        args=row.args,
        kwargs=row.kwargs,
        backend=row.backend,
        errors=[TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                for e in row.errors],
        worker_ids=list(row.worker_ids),
    )
    if row.status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.return_value)
    return result
