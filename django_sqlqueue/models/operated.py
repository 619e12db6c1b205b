"""Models the admin operates through: dead letters, and the pages that have no table.

Django's admin cannot register a model with a composite primary key (5.2 and 6.x both
refuse it), and the RFC's per-partition tables have one. So the partitions, subscribers
and overview pages are admin views of their own; the models here give them an entry on
the admin index, permissions and admin log entries, and own no table (``managed =
False``; nothing ever queries their ``db_table``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models

from .messages import QueueMessage


class DeadLetterManager(models.Manager["DeadLetter"]):
    """Only the dead-letter copies of the log: the rows a worker gave up on."""

    def get_queryset(self) -> models.QuerySet[DeadLetter]:
        # failed_at is 0 on every published message and the failure time on a copy; the
        # queue_msg_dead_letters index makes this a range over the copies alone.
        return super().get_queryset().filter(failed_at__gt=0)


class DeadLetter(QueueMessage):
    """A message a consumer group gave up on, as the admin lists it (a proxy of the log).

    Not the ``django_sqlqueue.DeadLetter`` exception a handler raises; this model is not
    exported from the package root.
    """

    objects: ClassVar[Any] = DeadLetterManager()

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"
        default_permissions = ("view",)
        permissions = [
            ("replay_deadletter", "Can replay dead letters to their consumer group"),
            ("discard_deadletter", "Can discard dead letters"),
        ]

    def __str__(self) -> str:
        key = f" key {self.message_key!r}" if self.message_key else ""
        return f"#{self.offset} {self.original_topic}{key} given up by {self.consumer_group}"


class Overview(models.Model):
    """The overview page: one row per topic and consumer group (no table)."""

    class Meta:
        managed = False
        db_table = "queue_admin_overview"  # never created, never queried
        verbose_name = "overview"
        verbose_name_plural = "overview"
        default_permissions = ("view",)
        permissions = [
            ("pause_group", "Can pause a consumer group on a topic"),
            ("resume_group", "Can resume a consumer group on a topic"),
        ]

    def __str__(self) -> str:
        return "overview"


class Partition(models.Model):
    """The partitions page: each group's lease and progress per partition (no table)."""

    class Meta:
        managed = False
        db_table = "queue_admin_partitions"  # never created, never queried
        verbose_name = "partition"
        verbose_name_plural = "partitions"
        default_permissions = ("view",)
        permissions = [("release_partition", "Can release a partition lease")]

    def __str__(self) -> str:
        return "partitions"


class Subscriber(models.Model):
    """The subscribers page: workers by heartbeat (no table)."""

    class Meta:
        managed = False
        db_table = "queue_admin_subscribers"  # never created, never queried
        verbose_name = "subscriber"
        verbose_name_plural = "subscribers"
        default_permissions = ("view",)
        permissions = [("forget_group", "Can forget a stopped consumer group")]

    def __str__(self) -> str:
        return "subscribers"
