"""One worker process over several databases: an engine per alias.

``SQLQUEUE["TOPICS"]`` may place topics on aliases of their own. A worker serving topics
on several aliases runs one :class:`~.process.Worker` per alias, each in a thread of its
own with its own connections, leases, poll cycle and handler threads: a server that stops
answering stalls only the engine (and the topics) on it, while the others go on. The
process's signals stop every engine; the first engine that ends with an error stops the
rest, so a refused start (a wrong password, a database that does not exist) is never
half a worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..conf import queue_database
from ..consuming.registry import Subscription
from .interrupts import stop_on_signals
from .process import Worker

if TYPE_CHECKING:
    from ..metrics.worker import WorkerMetrics

logger = logging.getLogger("django_sqlqueue.worker")

JOIN_SLICE = 0.5  # seconds; the main thread wakes this often to take signals


def by_database(subscriptions: Iterable[Subscription]) -> dict[str, list[Subscription]]:
    """``subscriptions`` grouped by the alias their topic lives on, the queue's own first."""
    grouped: dict[str, list[Subscription]] = {queue_database(): []}
    for subscription in subscriptions:
        grouped.setdefault(queue_database(subscription.topic), []).append(subscription)
    return {alias: subs for alias, subs in grouped.items() if subs}


def build_engines(subscriptions: Iterable[Subscription], *, name: str, concurrency: int,
                  database: str | None = None, schedules: bool = True, burst: bool = False,
                  metrics: WorkerMetrics | None = None) -> list[Worker]:
    """The engines of one worker process (runqueueworker, the embedded worker): one per
    alias the ``subscriptions``' topics live on, or all on ``database`` when given; the
    schedules, when asked for, fired by the first, from the queue's own alias."""
    subscriptions = list(subscriptions)
    placed = {database: subscriptions} if database else by_database(subscriptions)
    home = database or queue_database()
    return [
        Worker(placed_here, name=name, concurrency=concurrency, burst=burst, using=alias,
               metrics=metrics, schedules=schedules and index == 0 and home)
        for index, (alias, placed_here) in enumerate(placed.items())
    ]


def run_engines(workers: list[Worker], grace: float | None = None) -> Worker:
    """Run ``workers`` until every one has stopped; return the one whose exit status and
    reason the process should report (the first that failed, else the first)."""
    if len(workers) == 1:
        workers[0].run()
        return workers[0]
    failed: list[Worker] = []
    lock = threading.Lock()

    def stop_all() -> None:
        for worker in workers:
            worker.stop()

    def run(worker: Worker) -> None:
        try:
            worker.run()
        except BaseException:
            logger.exception("worker engine for database %s crashed", worker.using)
            worker.exit_code = worker.exit_code or 1
            worker.exit_reason = worker.exit_reason or (
                f"the engine for database {worker.using!r} crashed (see the log)")
        if worker.exit_code:
            with lock:
                failed.append(worker)
            stop_all()

    threads = [threading.Thread(target=run, args=(worker,), daemon=True,
                                name=f"sqlqueue-engine-{worker.using}") for worker in workers]
    with stop_on_signals(stop_all, grace):
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(JOIN_SLICE)
    return failed[0] if failed else workers[0]
