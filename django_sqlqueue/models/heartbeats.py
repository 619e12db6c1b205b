from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, models
from django.db.models.expressions import RawSQL

from ..db.liveness import alive_sql
from ..store import heartbeats as store_heartbeats
from ..store.connection import django_connection
from .fields import GROUP_LENGTH, SUBSCRIBER_NAME_LENGTH, TOPIC_LENGTH


def lock_held_expression(using: str) -> RawSQL:
    """True for a heartbeat whose worker still holds its liveness lock (or advertised
    none): false once the worker's session is gone (PostgreSQL, MariaDB/MySQL)."""
    connection = connections[using]
    return RawSQL(  # noqa: S611 - constant SQL and a quoted column
        alive_sql(connection, connection.ops.quote_name("liveness_token")), [],
        output_field=models.BooleanField())


class SubscriberHeartbeatManager(models.Manager["SubscriberHeartbeat"]):
    """``queue_subscriber_heartbeats`` for Django code: beat and deregister (the SQL of
    :mod:`django_sqlqueue.store.heartbeats`), count the living, prune."""

    def beat(self, group: str, topic: str, name: str, now_ms: int, using: str) -> None:
        store_heartbeats.beat(django_connection(using), group, topic, name, now_ms)

    def beat_many(self, subscriptions: Sequence[tuple[str, str]], name: str, now_ms: int,
                  using: str, liveness_token: str = "") -> None:
        """The heartbeats of one worker's subscriptions, in one statement per 200."""
        store_heartbeats.beat_many(django_connection(using), subscriptions, name, now_ms,
                                   liveness_token)

    def active_counts(self, topics: Sequence[str], alive_after_ms: int, using: str,
                      judge_liveness: bool = False) -> dict[tuple[str, str], int]:
        """Live workers per (consumer group, topic), in one query. ``judge_liveness``:
        a worker whose liveness lock no session holds any more is not counted, however
        fresh its heartbeat (PostgreSQL, MariaDB/MySQL)."""
        rows = self._live(alive_after_ms, using, judge_liveness).filter(topic__in=list(topics))
        counts = rows.values_list("consumer_group", "topic").annotate(
            n=models.Count("subscriber_name"))
        return {(group, topic): int(n) for group, topic, n in counts}

    def name_in_use(self, name: str, alive_after_ms: int, using: str,
                    judge_liveness: bool = False) -> bool:
        """Whether a live worker runs under ``name`` (``judge_liveness``: as for
        :meth:`active_counts`)."""
        return self._live(alive_after_ms, using, judge_liveness).filter(
            subscriber_name=name).exists()

    def _live(self, alive_after_ms: int, using: str,
              judge_liveness: bool) -> models.QuerySet[SubscriberHeartbeat]:
        rows = self.using(using).filter(deregistered_at=0, heartbeat_at__gt=alive_after_ms)
        if judge_liveness:
            rows = rows.filter(lock_held_expression(using))
        return rows

    def deregister(self, name: str, now_ms: int, using: str) -> int:
        return store_heartbeats.deregister(django_connection(using), name, now_ms=now_ms)

    def last_seen(self, topics: Sequence[str], using: str) -> dict[tuple[str, str], int]:
        """Per (consumer group, topic), the newest heartbeat (epoch ms) of any of its
        workers, stopped ones included (pruning keeps each group's newest row)."""
        rows = (
            self.using(using).filter(topic__in=list(topics))
            .values_list("consumer_group", "topic").annotate(last=models.Max("heartbeat_at"))
        )
        return {(group, topic): int(last or 0) for group, topic, last in rows}

    def prune(self, stopped_before_ms: int, using: str, limit: int = 1000) -> int:
        """Delete rows of workers stopped (deregistered, or silent) before
        ``stopped_before_ms``, except the newest row of each group and topic, which keeps
        the group's last sign of life for retention. Returns the rows deleted."""
        candidates = list(
            self.using(using).filter(heartbeat_at__lt=stopped_before_ms)
            .values_list("consumer_group", "topic", "subscriber_name", "heartbeat_at")[:limit]
        )
        if not candidates:
            return 0
        newest = self.last_seen(sorted({topic for _, topic, _, _ in candidates}), using)
        doomed = [(group, topic, name) for group, topic, name, beat in candidates
                  if beat < newest.get((group, topic), 0)]
        deleted = 0
        for group, topic, name in doomed:
            deleted += self.using(using).filter(
                consumer_group=group, topic=topic, subscriber_name=name,
                heartbeat_at__lt=stopped_before_ms).delete()[0]
        return deleted

    def groups_of(self, topics: Sequence[str], using: str) -> dict[str, list[str]]:
        """Every consumer group that has ever subscribed to each topic."""
        result: dict[str, list[str]] = {topic: [] for topic in topics}
        rows = (
            self.using(using).filter(topic__in=list(topics))
            .values_list("topic", "consumer_group").distinct()
        )
        for topic, group in rows:
            result[topic].append(group)
        return result


class SubscriberHeartbeat(models.Model):
    """A live worker of a consumer group, for fair-share leasing (``queue_subscriber_heartbeats``)."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "subscriber_name")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    subscriber_name = models.CharField(max_length=SUBSCRIBER_NAME_LENGTH)
    heartbeat_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    deregistered_at = models.BigIntegerField(default=0)  # 0 = active
    # The worker process's token while it holds a liveness lock named after it: a live
    # worker whose lock nobody holds any more is dead, fresh heartbeat or not.
    liveness_token = models.CharField(max_length=32, blank=True, db_default="")

    objects = SubscriberHeartbeatManager()

    class Meta:
        db_table = "queue_subscriber_heartbeats"
        verbose_name = "subscriber heartbeat"
        verbose_name_plural = "subscriber heartbeats"
        indexes = [
            # Live workers per group of a topic (fair share, membership checks).
            models.Index(fields=["topic", "deregistered_at", "heartbeat_at"],
                         name="queue_hb_live"),
            # A live worker under a name (start-up), and pruning by age.
            models.Index(fields=["subscriber_name", "heartbeat_at"], name="queue_hb_name"),
            models.Index(fields=["heartbeat_at"], name="queue_hb_age"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} {self.subscriber_name}"
