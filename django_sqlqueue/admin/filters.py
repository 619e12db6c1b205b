"""List filters whose choices come from small tables, never from a scan of the log."""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..conf import get_settings
from ..models import ConsumerOffset, Topic


def _topics(using: str) -> list[str]:
    return list(Topic.objects.using(using).order_by("topic").values_list("topic", flat=True))


class OriginalTopicFilter(admin.SimpleListFilter):
    """The topic a dead letter was published to."""

    title = "topic"
    parameter_name = "original_topic"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        suffix = get_settings().dlq_suffix
        return [(t, t) for t in _topics(model_admin.model.objects.db) if not t.endswith(suffix)]

    def has_output(self) -> bool:
        return True

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(original_topic=value) if value else queryset


class ConsumerGroupFilter(admin.SimpleListFilter):
    """The consumer group that gave up on a dead letter (from the registered groups)."""

    title = "consumer group"
    parameter_name = "consumer_group"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        groups = set(ConsumerOffset.objects.using(model_admin.model.objects.db)
                     .values_list("consumer_group", flat=True).distinct())
        if self.value():
            groups.add(str(self.value()))  # a retired group keeps its dead letters
        return [(g, g) for g in sorted(groups)]

    def has_output(self) -> bool:
        return True

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(consumer_group=value) if value else queryset


class FailedFilter(admin.SimpleListFilter):
    """When a dead letter failed (``failed_at`` is epoch milliseconds)."""

    title = "failed"
    parameter_name = "failed"
    SPANS = {"1h": ("Past hour", 3600), "24h": ("Past 24 hours", 86400),
             "7d": ("Past 7 days", 7 * 86400), "older": ("Older than 7 days", 7 * 86400)}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in self.SPANS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value not in self.SPANS:
            return queryset
        since = int((time.time() - self.SPANS[value][1]) * 1000)
        if value == "older":
            return queryset.filter(failed_at__lt=since)
        return queryset.filter(failed_at__gte=since)


class TopicFilter(admin.SimpleListFilter):
    """The topic of a message in the log."""

    title = "topic"
    parameter_name = "topic"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(t, t) for t in _topics(model_admin.model.objects.db)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(topic=value) if value else queryset


class PartitionFilter(admin.SimpleListFilter):
    """The partition of a message; offered once a topic is chosen (its recorded count)."""

    title = "partition"
    parameter_name = "partition"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        topic = request.GET.get("topic")
        if not topic:
            return []
        count = Topic.objects.using(model_admin.model.objects.db).filter(topic=topic).values_list(
            "partitions", flat=True).first()
        return [(str(p), str(p)) for p in range(int(count or 0))]

    def has_output(self) -> bool:
        return True  # so a partition given in the URL still shows as a filter

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(partition_key=value) if value is not None and value != "" else queryset
