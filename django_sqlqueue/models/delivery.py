from __future__ import annotations

from django.db import models

from .fields import GROUP_LENGTH, KEY_LENGTH, TOPIC_LENGTH


class DeliveryState(models.Model):
    """One consumer group's delivery of one message (the RFC's ``queue_delivery_state``).

    Beyond the RFC: ``last_error`` keeps the handler's most recent failure so the DLQ copy
    (and an operator) can see why a message is being retried.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key", "message_offset")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    message_offset = models.BigIntegerField()
    acked = models.BooleanField(default=False)
    # Epoch ms (database clock); only meaningful while acked is false.
    invisible_until = models.BigIntegerField(default=0)
    # Redeliveries so far: the attempt number is retry_count + 1.
    retry_count = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "queue_delivery_state"
        verbose_name = "delivery state"
        verbose_name_plural = "delivery states"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key}@{self.message_offset}"
