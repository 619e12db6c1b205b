from __future__ import annotations

from collections.abc import Mapping, Sequence

from django.db import connections, models
from django.db.models.expressions import RawSQL

from ..db import sql as sqlb
from ..db import vendor
from .fields import TOPIC_LENGTH


class TopicManager(models.Manager["Topic"]):
    """SQL for ``queue_topics``: record partition counts, read them, change one."""

    def partition_counts(self, topics: Sequence[str], using: str) -> dict[str, int]:
        """The recorded partition count of each topic that has one."""
        if not topics:
            return {}
        return dict(
            self.using(using).filter(topic__in=list(topics)).values_list("topic", "partitions")
        )

    def record(self, configured: Mapping[str, int], using: str) -> dict[str, int]:
        """Record ``configured`` counts for topics that have none yet; return every topic's
        recorded count. An existing record wins over the setting: changing a topic's count
        is a deliberate step (see :func:`django_sqlqueue.repartition.repartition`)."""
        recorded = self.partition_counts(list(configured), using)
        missing = {topic: count for topic, count in configured.items() if topic not in recorded}
        if missing:
            connection = connections[using]
            q = sqlb.quoter(connection)
            prefix, suffix = sqlb.insert_ignore(connection, ["topic"])
            now = vendor.now_ms_sql(connection)
            rows = ", ".join([f"(%s, %s, {now}, {now})"] * len(missing))
            sqlb.execute(
                connection,
                f"{prefix} {q('queue_topics')} ({q('topic')}, {q('partitions')}, "
                f"{q('created_at')}, {q('updated_at')}) VALUES {rows}{suffix}",
                [v for item in sorted(missing.items()) for v in item],
            )
            recorded.update(self.partition_counts(list(missing), using))
        return recorded

    def set_partitions(self, topic: str, partitions: int, using: str) -> None:
        now = RawSQL(vendor.now_ms_sql(connections[using]), [])  # noqa: S611 - the database clock, no input
        self.using(using).filter(topic=topic).update(partitions=partitions, updated_at=now)


class Topic(models.Model):
    """A topic's recorded partition count (``queue_topics``; not in the RFC).

    The sequencer maps each message's key to a partition with this count, so every
    process agrees on it; a changed setting does not silently re-map keys while messages
    of the old mapping are still being consumed.
    """

    topic = models.CharField(max_length=TOPIC_LENGTH, primary_key=True)
    partitions = models.IntegerField()
    created_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    updated_at = models.BigIntegerField(default=0)  # epoch ms, database clock

    objects = TopicManager()

    class Meta:
        db_table = "queue_topics"
        verbose_name = "topic"
        verbose_name_plural = "topics"

    def __str__(self) -> str:
        return f"{self.topic} ({self.partitions} partitions)"
