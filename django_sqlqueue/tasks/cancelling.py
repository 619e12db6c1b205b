"""Cancelling a task that has not started: its message is cancelled for the task group
(see :mod:`django_sqlqueue.cancelling`), and its result reads FAILED with a ``Cancelled``
error, written in the same transaction. A task already running or finished is left as
it is."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..cancelling import cancel
from ..exceptions import Cancelled
from ..models import QueueMessage, TaskResultRecord
from ..rows import decode_json, epoch_ms_to_datetime
from ..sequencing import sequence_all
from .compat import TaskResultDoesNotExist, TaskResultStatus
from .options import queues_by_database, topic_for
from .results import to_task_result


@dataclass(frozen=True)
class TaskCancellation:
    """What :meth:`QueueBackend.cancel` did: ``cancelled``, or not because the task had
    started or finished (``result.status`` says which); ``result`` as it reads now."""

    cancelled: bool
    result: Any  # django.tasks.TaskResult


def cancel_task(queues: list[str], result_id: str, by: str) -> TaskCancellation:
    """Cancel the READY task ``result_id`` of one of ``queues``, on the alias that holds it
    (each queue's topic may live on an alias of its own)."""
    grouped = queues_by_database(queues)
    for alias, names in grouped.items():
        topics = [topic_for(q) for q in names]
        if len(grouped) == 1 or (TaskResultRecord.objects.using(alias).filter(id=result_id).exists()
                or QueueMessage.objects.waiting_task(topics, result_id, alias) is not None):
            return _cancel_on(alias, topics, result_id, by)
    raise TaskResultDoesNotExist(result_id)


def _cancel_on(alias: str, topics: list[str], result_id: str, by: str) -> TaskCancellation:
    waiting = QueueMessage.objects.waiting_task(topics, result_id, alias)
    if waiting is not None and waiting.position is None:
        # Positioned before the transaction below, so that it holds no sequencer lock.
        sequence_all(alias, sequenced_by=by)
    with transaction.atomic(using=alias):
        row = TaskResultRecord.objects.using(alias).filter(id=result_id).first()
        if row is not None and row.status != TaskResultStatus.READY:
            return TaskCancellation(False, to_task_result(row))
        message = QueueMessage.objects.waiting_task(topics, result_id, alias)
        if message is None:
            raise TaskResultDoesNotExist(result_id)
        outcome = cancel(message.topic, result_id, key="", by=by, using=alias)
        if not outcome.cancelled:
            # A worker handed it out first: its RUNNING (or later) row is committed.
            row = TaskResultRecord.objects.using(alias).filter(id=result_id).first()
            if row is not None:
                return TaskCancellation(False, to_task_result(row))
        payload = decode_json(message.payload)
        if row is None:
            row = _row(payload, message.topic, epoch_ms_to_datetime(message.published_at))
        row.status = TaskResultStatus.FAILED
        row.finished_at = timezone.now()
        row.errors = [*row.errors, {
            "exception_class_path": f"{Cancelled.__module__}.{Cancelled.__qualname__}",
            "traceback": f"{Cancelled.__module__}.{Cancelled.__qualname__}: cancelled by "
                         f"{by} before it started\n",
        }]
        row.save(using=alias)
    return TaskCancellation(True, to_task_result(row))


def _row(payload: dict[str, Any], topic: str, enqueued_at: datetime) -> TaskResultRecord:
    run_after = payload.get("run_after")
    return TaskResultRecord(
        id=payload["id"], task_path=payload["task"], backend=payload["backend"],
        queue_name=topic.split(".", 1)[1], priority=int(payload.get("priority", 0)),
        args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
        run_after=datetime.fromisoformat(run_after) if run_after else None,
        enqueued_at=enqueued_at, worker_ids=[], errors=[],
    )
