from __future__ import annotations

from collections.abc import Mapping, Sequence

from django.db import connections, models

from ..db import sql as sqlb
from .fields import GROUP_LENGTH, SUBSCRIBER_NAME_LENGTH, TOPIC_LENGTH

MINUTE_MS = 60_000


class ThroughputManager(models.Manager["Throughput"]):
    """SQL for ``queue_throughput``: per-minute counters the workers add to, read by the
    overview and the metrics, pruned by GC."""

    def add(self, worker: str, minute_ms: int, counts: Mapping[tuple[str, str], tuple[int, int]],
            using: str) -> None:
        """Add (handled, failed) per (group, topic) to this worker's row of the minute
        starting at ``minute_ms``: one upsert for all. Each worker writes only its own
        rows, so workers of one group never wait for each other here."""
        if not counts:
            return
        connection = connections[using]
        q = sqlb.quoter(connection)
        tail = sqlb.on_conflict_update(
            connection, "queue_throughput", ("minute", "consumer_group", "topic", "subscriber_name"),
            {"handled": "{old} + {new}", "failed": "{old} + {new}"},
        )
        columns = ", ".join(q(c) for c in ("minute", "consumer_group", "topic", "subscriber_name",
                                            "handled", "failed"))
        params: list[object] = []
        for (group, topic), (handled, failed) in sorted(counts.items()):
            params += [minute_ms, group, topic, worker[:SUBSCRIBER_NAME_LENGTH], handled, failed]
        values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(counts))
        sqlb.execute(
            connection,
            f"INSERT INTO {q('queue_throughput')} ({columns}) VALUES {values}{tail}",  # noqa: S608 - names quoted, values bound
            params,
        )

    def per_minute(self, since_minute_ms: int, using: str, topics: Sequence[str] | None = None
                   ) -> dict[tuple[str, str], dict[int, tuple[int, int]]]:
        """Per (group, topic), {minute start (epoch ms): (handled, failed)} from
        ``since_minute_ms`` on, summed over workers. A range of the primary key."""
        rows = self.using(using).filter(minute__gte=since_minute_ms)
        if topics is not None:
            rows = rows.filter(topic__in=list(topics))
        result: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}
        for minute, group, topic, handled, failed in (
            rows.values_list("minute", "consumer_group", "topic")
            .annotate(h=models.Sum("handled"), f=models.Sum("failed"))
            .values_list("minute", "consumer_group", "topic", "h", "f")
        ):
            result.setdefault((group, topic), {})[int(minute)] = (int(handled or 0), int(failed or 0))
        return result

    def prune(self, before_minute_ms: int, using: str) -> int:
        return self.using(using).filter(minute__lt=before_minute_ms).delete()[0]


class Throughput(models.Model):
    """Messages a worker finished per minute for one group and topic (``queue_throughput``).

    ``handled`` counts acked and dead-lettered messages, ``failed`` failed runs (retried or
    dead-lettered). Workers add to it once per poll cycle; the overview's sparkline and the
    metrics read it instead of scanning the log. Rows older than a few hours are pruned.
    """

    pk = models.CompositePrimaryKey("minute", "consumer_group", "topic", "subscriber_name")
    minute = models.BigIntegerField()  # epoch ms of the minute's start, database clock
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    subscriber_name = models.CharField(max_length=SUBSCRIBER_NAME_LENGTH)
    handled = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)

    objects = ThroughputManager()

    class Meta:
        db_table = "queue_throughput"
        verbose_name = "throughput"
        verbose_name_plural = "throughput"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} @{self.minute} {self.handled}"
