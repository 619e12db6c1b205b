"""List filters whose choices come from small tables, never from a scan of the log.

Those tables grow too (a topic per tenant, groups that come and go), so each filter offers
at most CHOICES names, first by name, and says when there are more; a name given in the URL
(a link from the overview) is always among them and always filters.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..conf import get_settings
from ..models import ConsumerOffset, Topic
from .reading import database_for

CHOICES = 100  # names a filter or a page's select offers at most


def capped_names(queryset: QuerySet[Any], field: str, selected: str = "",
                 limit: int = CHOICES) -> tuple[list[str], bool]:
    """Up to ``limit`` distinct values of ``field``, sorted, with ``selected`` among them;
    and whether there are more."""
    names = list(queryset.order_by(field).values_list(field, flat=True).distinct()[:limit + 1])
    more = len(names) > limit
    names = names[:limit]
    if selected and selected not in names:
        names = sorted([*names, selected])
    return names, more


class CappedChoicesFilter(admin.SimpleListFilter):
    """A filter over names read from a small table, CHOICES of them at most."""

    template = "admin/django_sqlqueue/filter.html"
    cap = CHOICES
    more = False  # whether names beyond the first CHOICES were left out

    def names(self, using: str, selected: str) -> tuple[list[str], bool]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names, self.more = self.names(database_for(request), str(self.value() or ""))
        return [(name, name) for name in names]

    def has_output(self) -> bool:
        return True


class OriginalTopicFilter(CappedChoicesFilter):
    """The topic a dead letter was published to: the topics that have a dead-letter topic."""

    title = "topic"
    parameter_name = "original_topic"

    def names(self, using: str, selected: str) -> tuple[list[str], bool]:
        suffix = get_settings().dlq_suffix
        topics, more = capped_names(
            Topic.objects.using(using).filter(topic__endswith=suffix), "topic")
        names = sorted({t[:-len(suffix)] for t in topics} | ({selected} if selected else set()))
        return names, more

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(original_topic=value) if value else queryset


class ConsumerGroupFilter(CappedChoicesFilter):
    """The consumer group that gave up on a dead letter (from the registered groups; a
    retired group keeps its dead letters, and its name in the URL still filters)."""

    title = "consumer group"
    parameter_name = "consumer_group"

    def names(self, using: str, selected: str) -> tuple[list[str], bool]:
        return capped_names(ConsumerOffset.objects.using(using), "consumer_group", selected)

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


class TopicFilter(CappedChoicesFilter):
    """The topic of a message in the log (the recorded topics: every topic a worker has
    sequenced; any other topic named in the URL still filters)."""

    title = "topic"
    parameter_name = "topic"

    def names(self, using: str, selected: str) -> tuple[list[str], bool]:
        return capped_names(Topic.objects.using(using), "topic", selected)

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
        count = Topic.objects.using(database_for(request)).filter(topic=topic).values_list(
            "partitions", flat=True).first()
        return [(str(p), str(p)) for p in range(int(count or 0))]

    def has_output(self) -> bool:
        return True  # so a partition given in the URL still shows as a filter

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(partition_key=value) if value is not None and value != "" else queryset
