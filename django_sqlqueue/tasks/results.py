"""Turning a ``queue_task_results`` row into Django's ``TaskResult``."""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from ..models import TaskResultRecord
from .compat import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus


def load_task_path(path: str, result_id: str) -> Any:
    """The Task at ``path``; TaskResultDoesNotExist when there is none any more."""
    try:
        task = import_string(path)
    except ImportError as exc:
        raise TaskResultDoesNotExist(
            f"result {result_id!r} belongs to {path!r}, which cannot be imported") from exc
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(
            f"result {result_id!r} belongs to {path!r}, which is not a task")
    return task


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
