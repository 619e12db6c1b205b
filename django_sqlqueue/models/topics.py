from __future__ import annotations

from collections.abc import Mapping, Sequence

from django.db import models

from ..store import topics as store_topics
from ..store.connection import django_connection
from .fields import TOPIC_LENGTH


class TopicManager(models.Manager["Topic"]):
    """``queue_topics`` for Django code; the SQL is :mod:`django_sqlqueue.store.topics`."""

    def partition_counts(self, topics: Sequence[str], using: str) -> dict[str, int]:
        """The recorded partition count of each topic that has one."""
        return store_topics.partition_counts(django_connection(using), topics)

    def record(self, configured: Mapping[str, int], using: str) -> dict[str, int]:
        """Record ``configured`` counts for topics that have none yet; return every topic's
        recorded count (:func:`django_sqlqueue.store.topics.record`)."""
        return store_topics.record(django_connection(using), configured)

    def lock(self, topic: str, *, shared: bool, using: str) -> bool:
        """Lock the topic's row until the transaction ends
        (:func:`django_sqlqueue.store.topics.lock`)."""
        return store_topics.lock(django_connection(using), topic, shared=shared)

    def set_partitions(self, topic: str, partitions: int, using: str) -> None:
        store_topics.set_partitions(django_connection(using), topic, partitions)


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
