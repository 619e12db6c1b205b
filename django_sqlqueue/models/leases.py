from __future__ import annotations

from django.db import models

from .fields import GROUP_LENGTH, KEY_LENGTH, SUBSCRIBER_NAME_LENGTH, TOPIC_LENGTH


class PartitionLease(models.Model):
    """Which worker consumes a partition for a consumer group (``queue_partition_leases``).

    Beyond the RFC: ``generation`` is a fencing token, incremented whenever a different
    worker takes the lease. Every write a worker makes on the partition's behalf checks
    its generation in the same statement, so a worker that was paused past its lease
    cannot ack, deliver or move the watermark of a partition someone else now owns.
    An empty ``leased_by`` means the partition is free.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH, blank=True)
    leased_by = models.CharField(max_length=SUBSCRIBER_NAME_LENGTH, blank=True, default="")
    leased_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    lease_renewed_at = models.BigIntegerField(default=0)  # epoch ms, database clock
    generation = models.BigIntegerField(default=0)

    class Meta:
        db_table = "queue_partition_leases"
        verbose_name = "partition lease"
        verbose_name_plural = "partition leases"
        indexes = [
            models.Index(fields=["leased_by"], name="queue_lease_owner"),
            models.Index(fields=["lease_renewed_at"], name="queue_lease_renewed"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}/{self.partition_key} -> {self.leased_by or '-'}"
