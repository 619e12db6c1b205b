from __future__ import annotations

from django.db import models

from .fields import GROUP_LENGTH, SUBSCRIBER_NAME_LENGTH, TOPIC_LENGTH


class SubscriberHeartbeat(models.Model):
    """A live worker of a consumer group, for fair-share leasing (``queue_subscriber_heartbeats``)."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "subscriber_name")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    subscriber_name = models.CharField(max_length=SUBSCRIBER_NAME_LENGTH)
    heartbeat_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    deregistered_at = models.BigIntegerField(default=0)  # 0 = active

    class Meta:
        db_table = "queue_subscriber_heartbeats"
        verbose_name = "subscriber heartbeat"
        verbose_name_plural = "subscriber heartbeats"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} {self.subscriber_name}"
