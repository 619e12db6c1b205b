"""Garbage collection: delete messages every registered consumer group has acked past.

It runs in a thread of its own, on a connection of its own, so nothing it meets (a row an
open transaction holds, a horizon that jumped a million rows) delays the worker's poll
loop: leases are renewed and messages extended whatever GC does. Each run has a time
budget, and each statement a lock timeout; what is left is collected on the next run.

Which groups count: the *registered* ones, those with watermark rows for the topic
(workers create them at start, before they fetch), and the worker's own. A group whose
workers are all down still holds GC back; it stops doing so only when it is retired, by
an operator (``manage.py sqlqueue forget``) or after ``GROUP_RETENTION`` with no heartbeat
and no ack.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable

from django.db import connections, transaction

from ..conf import get_settings
from ..db import pooling
from ..db.errors import is_disconnect, is_transient
from ..models import (
    ArchiveMark,
    Cancellation,
    ConsumerOffset,
    QueueMessage,
    SubscriberHeartbeat,
    Throughput,
    waiting,
)

logger = logging.getLogger("django_sqlqueue.worker")

GC_BATCH = 1000  # messages deleted per statement
RUN_BUDGET = 2.0  # seconds of deleting per run, at most (one batch may overrun it)
LOCK_TIMEOUT = 1  # seconds a GC statement waits for a row lock before giving up on it
PRUNE_AFTER_MS = 3_600_000  # heartbeat rows of workers stopped this long ago are pruned
THROUGHPUT_KEEP_MS = 3 * 3_600_000  # per-minute throughput counters kept (the overview shows 1 h)
# Seconds between two looks for cancellation records of collected messages: each look
# reads the whole (small) table, so it does not follow a short GC_INTERVAL.
CANCELLATIONS_PRUNE_INTERVAL = 10.0


def collect_garbage(
    topics: Iterable[str], known_groups: dict[str, set[str]], using: str,
    collected: dict[tuple[str, str], int] | None = None, *,
    retention: float | None = None, budget: float | None = None,
    retired: set[tuple[str, str]] | None = None,
) -> int:
    """Delete, per partition, the messages at or below the lowest watermark of the groups
    that consume the topic, except those a group has parked and not yet acked (waiting
    messages the watermark passed); return how many.

    A partition that some counted group has no watermark for yet is not collected, so a
    group that is merely behind never loses messages. Dead-letter copies live in their own
    topic and are kept until that topic's own consumers pass them. ``retention`` (seconds)
    leaves out registered groups with neither a heartbeat nor an ack for that long
    (``known_groups``, the caller's own, always count); ``retired`` collects the ones left
    out, to log each once. ``collected`` remembers how far each partition was scanned by
    earlier calls, so partitions whose horizon has not moved cost nothing and parked
    messages are passed over once, not on every run. ``budget`` (seconds)
    stops the run early; the rest waits for the next one. With
    ``SQLQUEUE["ARCHIVE_BEFORE_GC"]`` nothing above a partition's archive mark is deleted.
    """
    collected = {} if collected is None else collected
    deadline = None if budget is None else time.monotonic() + budget
    deleted = 0
    topics = list(topics)
    registered = ConsumerOffset.objects.registered_groups(topics, using)
    seen = SubscriberHeartbeat.objects.last_seen(topics, using) if retention else {}
    archive_first = get_settings().archive_before_gc
    now_ms = int(time.time() * 1000)  # this host's clock: fine for a retention of days
    for topic in topics:
        groups = set(known_groups.get(topic, set()))
        for group, last_ack in registered.get(topic, {}).items():
            last = max(last_ack, seen.get((group, topic), 0))
            if retention is not None and retention and last < now_ms - retention * 1000 \
                    and group not in groups:
                if retired is not None and (group, topic) not in retired:
                    retired.add((group, topic))
                    logger.warning(
                        "consumer group %s of topic %s has had no worker and no ack for over "
                        "%.0f s (GROUP_RETENTION): it no longer holds back garbage "
                        "collection; its messages may be deleted before it reads them",
                        group, topic, retention)
                continue
            groups.add(group)
        horizons = ConsumerOffset.objects.gc_horizons(topic, sorted(groups), using)
        if archive_first:
            # Nothing above what the archive job exported; a partition it has not reached
            # yet keeps everything.
            archived = ArchiveMark.objects.archived(topic, using)
            horizons = {partition: min(horizon, archived[partition])
                        for partition, horizon in horizons.items() if archived.get(partition, 0) > 0}
        counted = sorted(groups)
        for partition, horizon in horizons.items():
            # Everything up to ``floor`` is collected but waiting messages (parked rows),
            # which the pass over settled parked rows below takes once they are acked.
            floor = collected.get((topic, partition), 0)
            if floor >= horizon:
                continue
            done = True
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    done = False
                    break
                found = QueueMessage.objects.collectable_offsets(
                    topic, partition, floor, horizon, GC_BATCH, counted, using)
                if found:
                    with transaction.atomic(using=using):
                        deleted += QueueMessage.objects.delete_offsets([o for o, _ in found], using)
                    floor = found[-1][1]
                if len(found) < GC_BATCH:
                    floor = horizon
                    break
            collected[(topic, partition)] = floor
            if not done:
                break
        if deadline is None or time.monotonic() <= deadline:
            deleted += _collect_settled(topic, counted, horizons, using)
    if deleted:
        logger.info("gc deleted=%s topics=%s", deleted, ",".join(topics))
    return deleted


def _collect_settled(topic: str, groups: list[str], horizons: dict[str, int], using: str) -> int:
    """Delete the messages that waited parked below the horizon and are now acked by
    every group that parked them, and drop the acked parked rows whose message is gone."""
    refs = waiting.settled(topic, groups, list(horizons), GC_BATCH, using)
    by_partition: dict[str, list[int]] = {}
    for partition, offset in refs:
        by_partition.setdefault(partition, []).append(offset)
    deleted = 0
    for partition, offsets in by_partition.items():
        gone = QueueMessage.objects.collectable_among(topic, offsets, horizons[partition], groups,
                                                      using)
        if gone:
            with transaction.atomic(using=using):
                deleted += QueueMessage.objects.delete_offsets(gone, using)
    if refs:
        present = set(QueueMessage.objects.using(using).filter(offset__in=[r.offset for r in refs])
                      .values_list("offset", flat=True))
        waiting.forget_settled(topic, groups, [r for r in refs if r.offset not in present], using)
    return deleted


class GarbageCollector:
    """Runs :func:`collect_garbage` every ``interval`` seconds in a thread of its own, and
    prunes the heartbeat rows of workers that stopped long ago."""

    def __init__(self, topics: list[str], known_groups: dict[str, set[str]], using: str,
                 interval: float, retention: float | None) -> None:
        self.topics = topics
        self.known_groups = known_groups
        self.using = using
        self.interval = interval
        self.retention = retention
        self._collected: dict[tuple[str, str], int] = {}
        self._retired: set[tuple[str, str]] = set()
        self._cancellations_pruned_at: float | None = None  # time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sqlqueue-gc", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait for it, at most ``timeout`` seconds (a run
        in progress ends within its budget and lock timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.run_once()
        finally:
            connections[self.using].close()

    def run_once(self) -> int:
        try:
            _bound_lock_waits(self.using)
            deleted = collect_garbage(
                self.topics, self.known_groups, self.using, self._collected,
                retention=self.retention, budget=RUN_BUDGET, retired=self._retired)
            now_ms = int(time.time() * 1000)
            SubscriberHeartbeat.objects.prune(now_ms - PRUNE_AFTER_MS, self.using)
            Throughput.objects.prune(now_ms - THROUGHPUT_KEEP_MS, self.using)
            last = self._cancellations_pruned_at
            if last is None or time.monotonic() - last >= CANCELLATIONS_PRUNE_INTERVAL:
                Cancellation.objects.prune_collected(GC_BATCH, self.using)
                self._cancellations_pruned_at = time.monotonic()
            return deleted
        except Exception as exc:  # noqa: BLE001 - GC must never stop the worker
            if is_transient(exc):
                # A row held by another transaction, say: collected on a later run. A lost
                # connection (the server restarted) is dropped, so the next run opens one.
                logger.info("gc postponed: %s: %s", type(exc).__name__,
                            " ".join(str(exc).split())[:200])
                if is_disconnect(exc):
                    with contextlib.suppress(Exception):
                        connections[self.using].close()
            else:
                logger.error("gc failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
                connections[self.using].close()
            return 0


def _bound_lock_waits(using: str) -> None:
    """Make this thread's GC statements give up on a locked row after LOCK_TIMEOUT."""
    connection = connections[using]
    connection.ensure_connection()
    if getattr(connection, "_sqlqueue_gc_bounded", None) is connection.connection:
        return
    if pooling.pooled(using):
        return  # a SET would stay with another client's server session
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {LOCK_TIMEOUT}")
        elif connection.vendor == "postgresql":
            cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}s'")
    connection._sqlqueue_gc_bounded = connection.connection  # type: ignore[attr-defined]
