"""Gauges read from the database at scrape time, per consumer group and topic.

A custom collector: ``describe()`` names the families without touching the database, so
registering it is free; ``collect()`` runs one :func:`django_sqlqueue.operations.overview`
and keeps its rows for ``SQLQUEUE["METRICS_CACHE_SECONDS"]``, so scrapes from several
Prometheus servers (or a dashboard hitting the view) cost one overview per interval.
Modelled on the Kafka exporter's consumer-group metrics. The gauges are read from
``SQLQUEUE["READ_DATABASE"]`` when the queue's alias has a read replica.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from ..conf import get_settings, queue_aliases, read_database
from ..operations import LimitStats, SubscriptionStats, limits_overview, overview

# (name, help, SubscriptionStats attribute)
GAUGES = (
    ("sqlqueue_consumer_group_lag", "Messages the group has not consumed yet (dead-lettered "
     "ones count as consumed); estimated beyond 200 in a partition.", "lag"),
    ("sqlqueue_consumer_group_oldest_pending_age_seconds", "Seconds since the oldest message "
     "the group has not consumed became due (0 when there is none).",
     "oldest_pending_age_seconds"),
    ("sqlqueue_consumer_group_in_flight", "Messages delivered to the group and not yet acked.",
     "in_flight"),
    ("sqlqueue_dead_letters", "Dead letters of the group's topic, not replayed or discarded "
     "(counted up to 10,000 per topic).",
     "dead_letters"),
    ("sqlqueue_consumer_group_workers", "Workers of the group with a live heartbeat.",
     "workers"),
    ("sqlqueue_consumer_group_paused", "1 while an operator has paused the group on the "
     "topic, else 0.", "paused"),
)

# (name, help, LimitStats attribute), labelled by limit scope.
LIMIT_GAUGES = (
    ("sqlqueue_limit_running", "Handlers of the limit's scope running now, across every "
     "worker (the slots its max_running limit has taken).", "running"),
    ("sqlqueue_limit_max_running", "The scope's max_running (0: no such limit).", "max_running"),
    ("sqlqueue_limit_tokens", "Tokens left in the scope's rate bucket (one period's starts "
     "when full).", "tokens"),
    ("sqlqueue_limit_keys_running", "Keys of the scope holding per-key slots now.",
     "keys_running"),
)


class DatabaseCollector:
    def __init__(self, using: str | None = None) -> None:
        # Gauges only read, and a scrape every 15 s or so lags anyway: each queue alias's
        # read replica (SQLQUEUE["READ_DATABASE"]) when it has one. Without ``using``,
        # every alias SQLQUEUE["TOPICS"] places topics on, each row labelled with it.
        self.aliases = [using] if using else queue_aliases()
        self.using = read_database(self.aliases[0])
        self._lock = threading.Lock()  # one overview at a time, shared by concurrent scrapes
        self._rows: list[SubscriptionStats] = []
        self._limits: list[LimitStats] = []
        self._read_at: float | None = None  # time.monotonic() of the cached rows

    @property
    def labelled(self) -> bool:
        """Whether the rows come from several aliases and say which (a ``database`` label)."""
        return len(self.aliases) > 1

    def rows(self) -> list[SubscriptionStats]:
        """The overview's rows, read again once they are older than the cache setting."""
        max_age = get_settings().metrics_cache_seconds
        with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= max_age:
                rows: list[SubscriptionStats] = []
                limits: list[LimitStats] = []
                for alias in self.aliases:
                    reading = read_database(alias)
                    found = overview(using=reading, minutes=1)
                    rows += ([replace(row, database=alias) for row in found] if self.labelled
                             else found)
                    limits += limits_overview(using=reading)
                self._rows, self._limits = rows, limits
                self._read_at = time.monotonic()
            return self._rows

    def limit_rows(self) -> list[LimitStats]:
        """The limits, read with the overview's rows (and cached with them)."""
        self.rows()
        with self._lock:
            return self._limits

    def clear(self) -> None:
        """Forget the cached rows: the next scrape reads the database."""
        with self._lock:
            self._read_at = None

    def _families(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["group", "topic", "database"] if self.labelled else ["group", "topic"]
        return [*(GaugeMetricFamily(name, text, labels=labels)
                  for name, text, _ in GAUGES),
                *(GaugeMetricFamily(name, text, labels=["scope"])
                  for name, text, _ in LIMIT_GAUGES)]

    def describe(self) -> list[Any]:
        return self._families()

    def collect(self) -> list[Any]:
        families = self._families()
        for row in self.rows():
            for family, (_, _, attribute) in zip(families, GAUGES, strict=False):
                value = getattr(row, attribute)
                values = [row.group, row.topic, row.database][:3 if self.labelled else 2]
                family.add_metric(values, float(value or 0))
        for limit in self.limit_rows():
            for family, (_, _, attribute) in zip(families[len(GAUGES):], LIMIT_GAUGES,
                                                 strict=True):
                value = getattr(limit, attribute)
                if value is not None:
                    family.add_metric([limit.scope], float(value))
        return families
