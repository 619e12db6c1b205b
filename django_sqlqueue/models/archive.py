from __future__ import annotations

from django.db import models

from ..store import archive as store_archive
from ..store.connection import django_connection
from .fields import KEY_LENGTH, TOPIC_LENGTH


class ArchiveMarkManager(models.Manager["ArchiveMark"]):
    """``queue_archive`` for Django code; the SQL is :mod:`django_sqlqueue.store.archive`."""

    def archived(self, topic: str, using: str) -> dict[str, int]:
        """Per partition of ``topic``, the position up to which its messages are archived."""
        return store_archive.marks(django_connection(using), topic)


class ArchiveMark(models.Model):
    """How far the archive job has exported one partition of a topic (``queue_archive``).

    Every message of the partition at or below ``archived_position`` is in the archive.
    With ``SQLQUEUE["ARCHIVE_BEFORE_GC"]`` GC deletes nothing above it. ``pending_run`` names
    an export whose files were being moved into place: a rerun removes them first.
    """

    pk = models.CompositePrimaryKey("topic", "partition_key")
    topic = models.CharField(max_length=TOPIC_LENGTH)
    partition_key = models.CharField(max_length=KEY_LENGTH)
    archived_position = models.BigIntegerField(default=0)
    pending_position = models.BigIntegerField(default=0)
    pending_run = models.CharField(max_length=64, blank=True, default="")
    updated_at = models.BigIntegerField(default=0)  # epoch ms, database clock

    objects = ArchiveMarkManager()

    class Meta:
        db_table = "queue_archive"
        verbose_name = "archive mark"
        verbose_name_plural = "archive marks"

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition_key} archived to {self.archived_position}"
