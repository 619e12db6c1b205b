"""The worker's start line: what it runs, with what, against which database.

One line an operator reads first in a worker's log, in the log's ``key=value`` format.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import connections

from ..consuming.registry import Subscription
from ..models.task_results import TASK_GROUP, TASK_TOPIC_PREFIX

logger = logging.getLogger("django_sqlqueue.worker")


def log_start(*, name: str, using: str, concurrency: int, burst: bool, schedules: bool,
              subscriptions: Sequence[Subscription], liveness: bool = False) -> None:
    """``worker started`` with its name, database alias and vendor, concurrency, mode,
    whether it holds a liveness lock (``lock``) or is judged by its leases alone
    (``lease``), the @subscriber subscriptions (``topic:group``) and the task queues."""
    queues = sorted(s.topic[len(TASK_TOPIC_PREFIX):] for s in subscriptions
                    if _is_task_queue(s.group, s.topic))
    handlers = [f"{s.topic}:{s.group}" for s in subscriptions
                if not _is_task_queue(s.group, s.topic)]
    logger.info(
        "worker started name=%s database=%s vendor=%s concurrency=%s burst=%s schedules=%s "
        "liveness=%s subscriptions=%s queues=%s",
        name, using, connections[using].vendor, concurrency,
        "yes" if burst else "no", "yes" if schedules else "no", "lock" if liveness else "lease",
        ",".join(handlers) or "-", ",".join(queues) or "-",
    )


def _is_task_queue(group: str, topic: str) -> bool:
    return group == TASK_GROUP and topic.startswith(TASK_TOPIC_PREFIX)
