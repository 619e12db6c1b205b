"""The worker's start line: what it runs, with what, against which database.

One line an operator reads first in a worker's log, in the log's ``key=value`` format.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.db import connections

from ..models.task_results import TASK_GROUP, TASK_TOPIC_PREFIX

if TYPE_CHECKING:
    from .process import Worker

logger = logging.getLogger("django_sqlqueue.worker")


def log_start(worker: Worker) -> None:
    """``worker started`` with its name, database alias and vendor, concurrency, mode,
    the @subscriber subscriptions (``topic:group``) and the task queues."""
    queues = sorted(s.topic[len(TASK_TOPIC_PREFIX):] for s in worker.subscriptions
                    if _is_task_queue(s.group, s.topic))
    subscriptions = [f"{s.topic}:{s.group}" for s in worker.subscriptions
                     if not _is_task_queue(s.group, s.topic)]
    logger.info(
        "worker started name=%s database=%s vendor=%s concurrency=%s burst=%s schedules=%s "
        "subscriptions=%s queues=%s",
        worker.name, worker.using, connections[worker.using].vendor, worker.concurrency,
        "yes" if worker.burst else "no", "yes" if worker.scheduler is not None else "no",
        ",".join(subscriptions) or "-", ",".join(queues) or "-",
    )


def _is_task_queue(group: str, topic: str) -> bool:
    return group == TASK_GROUP and topic.startswith(TASK_TOPIC_PREFIX)
