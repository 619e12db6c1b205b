"""``queue_task_results``: one row per started task, what ``get_result`` reads.

Until a worker starts a task, its message in the log is all there is (``get_result`` reads
it from there). The worker writes the row inside its poll transaction: RUNNING as each
attempt is handed out, READY again after a failed attempt that will be retried,
SUCCESSFUL or FAILED at the end. Only one worker runs a task at a time (its message is
invisible to the others), so a read-modify-write under a row lock is enough to append to
the JSON lists.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models

from .fields import ID_LENGTH

# A task queue Q is the topic ``tasks.Q``, consumed by the group ``tasks``.
TASK_TOPIC_PREFIX = "tasks."
TASK_GROUP = "tasks"
STATUS_LENGTH = 10
TASK_PATH_LENGTH = 255
QUEUE_NAME_LENGTH = 100
BACKEND_LENGTH = 100


class TaskResultQuerySet(models.QuerySet["TaskResultRecord"]):
    def finished_before(self, moment: datetime) -> TaskResultQuerySet:
        return self.filter(finished_at__lt=moment, status__in=("SUCCESSFUL", "FAILED"))

    def prune(self, moment: datetime, batch: int = 1000) -> int:
        """Delete finished results older than ``moment``, ``batch`` rows per statement so
        no statement holds many locks."""
        deleted = 0
        while True:
            ids = list(self.finished_before(moment).values_list("id", flat=True)[:batch])
            if not ids:
                return deleted
            deleted += self.filter(id__in=ids).delete()[0]
            if len(ids) < batch:
                return deleted


class TaskResultRecord(models.Model):
    """A task's result: status, timings, one worker id per attempt, every error."""

    id = models.CharField(primary_key=True, max_length=ID_LENGTH)
    task_path = models.CharField(max_length=TASK_PATH_LENGTH)
    backend = models.CharField(max_length=BACKEND_LENGTH)
    queue_name = models.CharField(max_length=QUEUE_NAME_LENGTH)
    priority = models.IntegerField(default=0)
    status = models.CharField(max_length=STATUS_LENGTH, default="READY")
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    run_after = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    worker_ids = models.JSONField(default=list)
    # [{"exception_class_path": ..., "traceback": ...}, ...], one per failed attempt
    errors = models.JSONField(default=list)
    return_value = models.JSONField(null=True, blank=True)

    objects = TaskResultQuerySet.as_manager()

    class Meta:
        db_table = "queue_task_results"
        verbose_name = "task result"
        verbose_name_plural = "task results"
        indexes = [models.Index(fields=["finished_at"], name="queue_task_results_finished")]

    def __str__(self) -> str:
        return f"{self.task_path}[{self.id}] {self.status}"


def reopen_replayed_tasks(sender: object, replays: list[Any], using: str, **kwargs: Any) -> None:
    """Receiver of ``dead_letters_replayed``: a FAILED task whose dead letter is replayed
    is READY again under the same result id, its earlier errors and worker ids kept. It
    runs in the replay's transaction, so no worker can start the replay before this."""
    ids = [r.original_id for r in replays
           if r.group == TASK_GROUP and r.topic.startswith(TASK_TOPIC_PREFIX) and r.original_id]
    if ids:
        TaskResultRecord.objects.using(using).filter(id__in=ids, status="FAILED").update(
            status="READY", finished_at=None)
