from __future__ import annotations

from django.db import models

from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH


class ConsumerOffset(models.Model):
    """A consumer group's contiguous-acked watermark for one partition (``queue_offsets``).

    ``offset_acked`` is measured in log *positions* (see ``QueueMessage.position``), the
    commit-ordered sequence consumers read by: every message of the partition whose
    position is at or below it has been acked by the group.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    offset_acked = models.BigIntegerField(default=0)
    updated_at = models.BigIntegerField(default=0)  # epoch ms, database clock

    class Meta:
        db_table = "queue_offsets"
        verbose_name = "consumer offset"
        verbose_name_plural = "consumer offsets"
        indexes = [
            models.Index(fields=["consumer_group"], name="queue_offsets_group"),
            models.Index(fields=["topic"], name="queue_offsets_topic"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key} = {self.offset_acked}"
