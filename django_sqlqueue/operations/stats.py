"""The overview: one row per topic and consumer group, and the health probe built on it.

Every figure comes from small, indexed reads: lag from the watermarks (an index range
above each, exact up to LAG_SAMPLE per partition, else estimated from that sample), in flight
and out-of-order acks from the group's delivery rows (a window of at most a few thousand
per partition), dead letters capped, throughput from the
per-minute counters the workers write. Nothing counts the whole log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import connections

from ..conf import get_settings, queue_database
from ..db import vendor
from ..db.liveness import judged_by_locks
from ..models import (
    ConsumerOffset,
    DeliveryState,
    GroupControl,
    QueueMessage,
    SubscriberHeartbeat,
    Throughput,
)
from ..models.throughput import MINUTE_MS
from ..store import dead_letters as dead_letter_rows
from ..store.connection import django_connection
from .errors import UnknownSubscription
from .names import check_name, database_now_ms

# Lag is counted exactly in each partition up to LAG_SAMPLE messages above the watermark;
# a partition with more is estimated from those (ConsumerOffsetManager.lag_figures): a
# bounded read whatever the backlog.
LAG_SAMPLE = 200
WINDOW_CAP = 100_000  # delivery rows counted per group and topic at most
DEAD_LETTER_CAP = 10_000  # dead letters counted per topic at most
# Unsequenced messages read at most (over all topics); more make the lag an estimate.
UNSEQUENCED_CAP = 10_000
SPARKLINE_MINUTES = 60


@dataclass(frozen=True)
class SubscriptionStats:
    """One consumer group on one topic, as the overview, ``stats --json`` and the metrics
    show it. Counts at their cap are flagged ``*_capped``."""

    topic: str
    group: str
    lag: int  # messages not yet consumed (a dead-lettered message counts as consumed)
    in_flight: int  # delivered, unacked, still invisible
    dead_letters: int  # this group's dead letters of this topic, not replayed or discarded
    oldest_pending_age_seconds: float | None  # since the oldest unconsumed message was due
    workers: int  # live workers (heartbeat within LEASE_DURATION)
    paused: bool
    partitions: int  # the group's watermark rows for the topic
    handled_per_minute: list[int] = field(default_factory=list)  # oldest minute first
    failed_per_minute: list[int] = field(default_factory=list)
    lag_estimated: bool = False  # a partition has over LAG_SAMPLE: lag is an estimate
    dead_letters_capped: bool = False  # dead_letters stopped counting at DEAD_LETTER_CAP
    # The alias holding the topic, where SQLQUEUE["TOPICS"] places topics on several;
    # empty (and left out of as_json) with one.
    database: str = ""

    def as_json(self) -> dict[str, Any]:
        values = asdict(self)
        if not self.database:
            del values["database"]
        return values


def overview(*, topic: str | None = None, group: str | None = None, using: str | None = None,
             minutes: int = SPARKLINE_MINUTES) -> list[SubscriptionStats]:
    """One row per registered (topic, group), sorted, optionally only ``topic``/``group``.

    Dead-letter topics appear as topics of their own when some group consumes them.
    """
    using = using or queue_database(topic)
    if topic is not None:
        check_name("topic", topic)
    if group is not None:
        check_name("consumer group", group)
    with vendor.without_jit(connections[using]):
        return _overview(topic, group, using, minutes)


def _overview(topic: str | None, group: str | None, using: str,
              minutes: int) -> list[SubscriptionStats]:
    conf = get_settings()
    now_ms = database_now_ms(using)
    # One query per kind of figure, whatever the number of rows (up to a hundred
    # topic x group rows per query for the delivery windows, 200 topics for dead letters).
    marks = ConsumerOffset.objects.lag_figures(LAG_SAMPLE, using, topic=topic, group=group,
                                                 now_ms=now_ms)
    topics = sorted({t for t, _ in marks})
    if not topics:
        return []
    pairs = sorted(marks)
    workers = SubscriberHeartbeat.objects.active_counts(
        topics, now_ms - int(conf.lease_duration * 1000), using,
        judge_liveness=judged_by_locks(using))
    controls = GroupControl.objects.states(topics, using)
    first_minute = now_ms - now_ms % MINUTE_MS - (minutes - 1) * MINUTE_MS
    throughput = Throughput.objects.per_minute(first_minute, using, topics)
    # Messages no worker has sequenced yet (none is running, say) are lag of every group of
    # their topic: without them an overview of a stopped fleet would read "lag 0".
    unsequenced = QueueMessage.objects.unsequenced_by_topic(UNSEQUENCED_CAP, using)
    unsequenced_capped = sum(n for n, _ in unsequenced.values()) >= UNSEQUENCED_CAP
    dead = dead_letter_rows.counts_by_group(django_connection(using),
                                            [t + conf.dlq_suffix for t in topics], DEAD_LETTER_CAP)
    windows = DeliveryState.objects.window_counts([(g, t) for t, g in pairs], now_ms,
                                                  WINDOW_CAP, using)
    minute_starts = [first_minute + i * MINUTE_MS for i in range(minutes)]
    rows = []
    for t, g in pairs:
        figures = marks[(t, g)]
        acked, in_flight = windows[(g, t)]
        waiting, oldest_waiting = unsequenced.get(t, (0, now_ms))
        lag = max(0, figures.lag - acked)
        oldest = figures.oldest_due if lag else None
        if waiting:
            lag += waiting
            oldest = oldest_waiting if oldest is None else min(oldest, oldest_waiting)
        series = throughput.get((g, t), {})
        dead_here = dead[t + conf.dlq_suffix]
        state = controls.get((g, t))
        rows.append(SubscriptionStats(
            topic=t, group=g, lag=lag, in_flight=in_flight, dead_letters=dead_here.get(g, 0),
            oldest_pending_age_seconds=(None if oldest is None
                                        else round(max(0, now_ms - oldest) / 1000, 3)),
            workers=workers.get((g, t), 0), paused=bool(state and state.paused),
            partitions=figures.partitions,
            handled_per_minute=[series.get(m, (0, 0))[0] for m in minute_starts],
            failed_per_minute=[series.get(m, (0, 0))[1] for m in minute_starts],
            lag_estimated=figures.estimated or (bool(waiting) and unsequenced_capped),
            dead_letters_capped=sum(dead_here.values()) >= DEAD_LETTER_CAP,
        ))
    return rows


@dataclass(frozen=True)
class Health:
    ok: bool
    line: str  # one line saying why (for a container probe's log)


def health(*, group: str | None = None, max_age: float | None = None,
           using: str | None = None) -> Health:
    """Healthy when each registered group (or ``group``) has a live worker on each of its
    topics, and, with ``max_age`` (seconds), nothing it has not consumed has been due for
    longer. A paused group counts as healthy while it has a live worker."""
    using = using or queue_database()
    rows = overview(group=group, using=using, minutes=1)
    if group is not None and not rows:
        raise UnknownSubscription(f"consumer group {group!r} is not registered for any topic")
    problems = []
    for row in rows:
        failing = []  # every condition that fails, not only the first
        if row.workers == 0:
            failing.append("no live worker")
        if (max_age is not None and row.oldest_pending_age_seconds is not None
                and row.oldest_pending_age_seconds > max_age and not row.paused):
            failing.append(f"oldest pending message due {row.oldest_pending_age_seconds:.0f}s "
                           f"ago (max {max_age:g}s)")
        if failing:
            problems.append(f"{row.group}/{row.topic}: {', '.join(failing)}")
    if problems:
        return Health(False, "unhealthy: " + "; ".join(problems))
    return Health(True, f"ok: {len(rows)} subscription(s) have live workers"
                  + (f" and nothing pending over {max_age:g}s" if max_age is not None else ""))

