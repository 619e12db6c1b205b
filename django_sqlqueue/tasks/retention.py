"""Deleting finished task results older than ``OPTIONS["RESULT_RETENTION"]``.

Each worker that runs task queues prunes its backends' results on a thread of its own,
when it starts and then every ``SQLQUEUE["GC_INTERVAL"]`` seconds (a minute when GC is
off), whether or not it runs any task: results never outlive their retention because a
queue went quiet.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from ..conf import get_settings
from ..models import TaskResultRecord
from .compat import task_backends

logger = logging.getLogger("django_sqlqueue.tasks")

IDLE_GC_INTERVAL = 60.0  # seconds between prunings when SQLQUEUE["GC_INTERVAL"] is 0 (off)


class ResultPruner:
    """Prunes the results of the backends ``aliases`` until the worker stops."""

    def __init__(self, aliases: list[str]) -> None:
        self.aliases = aliases
        self._thread: threading.Thread | None = None

    def start(self, stopping: threading.Event, using: str) -> None:
        """Prune now and then on schedule on a daemon thread, until ``stopping`` is set."""
        if self._thread is not None or not self._retentions():
            return
        interval = get_settings().gc_interval or IDLE_GC_INTERVAL
        self._thread = threading.Thread(target=self._run, args=(stopping, using, interval),
                                        name="sqlqueue-task-results", daemon=True)
        self._thread.start()

    def _run(self, stopping: threading.Event, using: str, interval: float) -> None:
        try:
            while not stopping.is_set():
                self.prune(using)
                # The connection is this thread's: do not hold it between prunings.
                connections[using].close()
                stopping.wait(interval)
        finally:
            connections[using].close()

    def prune(self, using: str) -> int:
        """Delete results finished longer ago than their backend's retention; a failure is
        logged and the next round tries again."""
        deleted = 0
        for alias, retention in self._retentions().items():
            cutoff = timezone.now() - timedelta(seconds=retention)
            try:
                count = TaskResultRecord.objects.using(using).filter(backend=alias).prune(cutoff)
            except Exception as exc:  # noqa: BLE001 - housekeeping; the next round retries
                logger.warning("could not prune task results backend=%s: %s: %s", alias,
                               type(exc).__name__, exc)
                continue
            if count:
                logger.info("pruned task results backend=%s deleted=%s", alias, count)
            deleted += count
        return deleted

    def _retentions(self) -> dict[str, float]:
        """Retention (seconds) of each backend that does not keep its results for ever."""
        retentions = {}
        for alias in self.aliases:
            backend: Any = task_backends[alias]
            retention = backend.queue_options.result_retention
            if retention is not None:
                retentions[alias] = retention
        return retentions
