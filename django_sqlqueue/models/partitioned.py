"""What the tables with one row per (consumer group, topic, partition) share."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db import models

from ..db import sql as sqlb


class PartitionRowsManager(models.Manager[Any]):
    """For ``queue_partition_leases`` and ``queue_offsets``: keyed by group, topic, partition."""

    def delete_other_partitions(self, topic: str, keep: Collection[str], using: str) -> int:
        """Delete every group's rows of the topic's partitions not in ``keep`` (the topic
        shrank). Each DELETE names its group, so it locks a primary-key range rather than
        scanning (and waiting for) rows that workers of other topics hold."""
        doomed: dict[str, list[str]] = {}
        for group, partition in (
            self.using(using).filter(topic=topic)
            .values_list("consumer_group", "partition_key").distinct()
        ):
            if partition not in keep:
                doomed.setdefault(group, []).append(partition)
        deleted = 0
        for group, partitions in doomed.items():
            for batch in sqlb.chunks(partitions, 500):
                deleted += self.using(using).filter(
                    consumer_group=group, topic=topic, partition_key__in=batch).delete()[0]
        return deleted
