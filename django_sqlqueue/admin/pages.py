"""The admin pages that are views of their own: partitions and subscribers.

Their tables have composite primary keys, which Django's admin cannot register, so each
page is the changelist view of a table-less model (see models/operated.py): it appears on
the admin index, is guarded by that model's permissions and renders its own template.
"""

from __future__ import annotations

from typing import Any

import django
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from .. import operations
from ..conf import get_settings
from ..db.liveness import judged_by_locks
from ..groups import GroupInUse, UnknownGroup
from ..models import (
    ConsumerOffset,
    LogSequencer,
    Partition,
    PartitionLease,
    QueueMessage,
    Subscriber,
    SubscriberHeartbeat,
)
from ..models.heartbeats import lock_held_expression
from .actions import record
from .bounded import QueueModelAdmin
from .display import age, when
from .filters import CHOICES, capped_names
from .paginator import CappedPaginator
from .reading import database_choices, database_for, database_query, queue_alias_for

LIST_BREADCRUMBS = django.VERSION >= (6, 0)  # Django 6 draws breadcrumbs as a list
LAG_CAP = 100_000  # messages counted above a watermark at most, per partition
LAG_BUDGET = 100_000  # messages counted at most in all, per view of the partitions page
ROWS_PER_PAGE = 100


class PageAdmin(QueueModelAdmin):
    """A read-only page under the admin index, drawn by ``template`` from ``page_context()``."""

    template = ""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        from django.urls import path

        info = self.opts.app_label, self.opts.model_name
        return [path("", self.admin_site.admin_view(self.changelist_view),
                     name="{}_{}_changelist".format(*info))]

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            self.act(request)
            return HttpResponseRedirect(request.get_full_path())
        using = database_for(request)  # the read replica, unless an action was just taken
        now_ms = LogSequencer.objects.head(using)[2]  # the database clock
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": str(self.opts.verbose_name_plural).capitalize(),
            "sqlqueue_list_breadcrumbs": LIST_BREADCRUMBS,
            "now_ms": now_ms,
            "sqlqueue_databases": database_choices(request),
            "sqlqueue_database_query": database_query(request),
            **self.page_context(request, using, now_ms),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.template, context)

    def using(self, request: HttpRequest) -> str:
        """The queue alias the page shows, which its actions act on."""
        return queue_alias_for(request)

    def page_context(self, request: HttpRequest, using: str, now_ms: int) -> dict[str, Any]:
        raise NotImplementedError

    def act(self, request: HttpRequest) -> None:
        """Run the action posted to the page (each checks its own permission)."""
        raise PermissionDenied


def _choice(request: HttpRequest, name: str) -> str:
    return request.GET.get(name, "").strip()


def lag_cap(rows: int) -> int:
    """How far the lag of each of ``rows`` partitions on one page is counted: LAG_BUDGET
    shared among them, and LAG_CAP at most. A page of 100 partitions counts 1,000 each; one
    topic of one group (filter by both) counts further."""
    return max(1, min(LAG_CAP, LAG_BUDGET // max(1, rows)))


@admin.register(Partition)
class PartitionAdmin(PageAdmin):
    template = "admin/django_sqlqueue/partitions.html"

    def page_context(self, request: HttpRequest, using: str, now_ms: int) -> dict[str, Any]:
        group, topic = _choice(request, "group"), _choice(request, "topic")
        offsets = ConsumerOffset.objects.using(using).order_by(
            "consumer_group", "topic", "partition_key")
        if group:
            offsets = offsets.filter(consumer_group=group)
        if topic:
            offsets = offsets.filter(topic=topic)
        paginator = CappedPaginator(
            offsets.values_list("consumer_group", "topic", "partition_key", "offset_acked"),
            ROWS_PER_PAGE)
        page = paginator.get_page(request.GET.get("p"))
        marks = list(page.object_list)
        leases = {
            (lease.consumer_group, lease.topic, lease.partition_key): lease
            for lease in PartitionLease.objects.using(using).filter(
                consumer_group__in={m[0] for m in marks}, topic__in={m[1] for m in marks},
                partition_key__in={m[2] for m in marks})
        } if marks else {}
        cap = lag_cap(len(marks))
        progress = QueueMessage.objects.partition_progress(
            [(t, p, int(w)) for _, t, p, w in marks], cap, using)
        stale_before = now_ms - int(get_settings().lease_duration * 1000)
        rows = []
        for g, t, p, watermark in marks:
            lease = leases.get((g, t, p))
            owner = lease.leased_by if lease is not None else ""
            seen = progress.get((t, p, int(watermark)))
            rows.append({
                "group": g, "topic": t, "partition": p,
                "owner": owner or "-",
                "lease_age": age((now_ms - lease.leased_at) / 1000)
                if lease is not None and owner else "-",
                "stale": bool(owner) and lease is not None and lease.lease_renewed_at < stale_before,
                "watermark": watermark,
                "newest": seen.newest if seen and seen.newest is not None else "-",
                "lag": seen.lag if seen else 0,
                "lag_capped": bool(seen and seen.lag >= cap),
                "oldest": age((now_ms - seen.oldest_pending) / 1000)
                if seen and seen.oldest_pending else "-",
            })
        all_marks = ConsumerOffset.objects.using(using)
        groups, more_groups = capped_names(all_marks, "consumer_group", group)
        topics, more_topics = capped_names(all_marks, "topic", topic)
        return {
            "rows": rows,
            "page": page,
            "group": group,
            "topic": topic,
            "groups": groups,
            "topics": topics,
            "more_choices": more_groups or more_topics,
            "choices_cap": CHOICES,
            "lag_cap": cap,
            "lag_budget": LAG_BUDGET,
            "can_release": self.has_release_permission(request),
        }

    def has_release_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "release_partition")

    def act(self, request: HttpRequest) -> None:
        if request.POST.get("action") != "release" or not self.has_release_permission(request):
            raise PermissionDenied
        group, topic = request.POST.get("group", ""), request.POST.get("topic", "")
        partition = request.POST.get("partition", "")
        try:
            released = operations.release_leases(group=group, topic=topic, partition=partition,
                                                 using=self.using(request))
        except operations.OperationError as exc:
            messages.error(request, str(exc))
            return
        if not released.leases:
            messages.info(request, f"Partition {partition} of {topic!r} for {group!r} was not "
                          "leased; nothing changed.")
            return
        record(request, Partition,
               f"Released partition {partition} of topic {topic!r} for consumer group "
               f"{group!r}: its owner drops it at its next poll and the group rebalances.")


@admin.register(Subscriber)
class SubscriberAdmin(PageAdmin):
    template = "admin/django_sqlqueue/subscribers.html"

    def page_context(self, request: HttpRequest, using: str, now_ms: int) -> dict[str, Any]:
        group, topic = _choice(request, "group"), _choice(request, "topic")
        beats = SubscriberHeartbeat.objects.using(using).order_by(
            "consumer_group", "topic", "subscriber_name")
        if group:
            beats = beats.filter(consumer_group=group)
        if topic:
            beats = beats.filter(topic=topic)
        if judged_by_locks(using):
            # A killed worker's session is gone with it: "gone" at once, not "live" until
            # its heartbeat ages.
            beats = beats.annotate(lock_held=lock_held_expression(using))
        paginator = CappedPaginator(beats, ROWS_PER_PAGE)
        page = paginator.get_page(request.GET.get("p"))
        alive_after = now_ms - int(get_settings().lease_duration * 1000)
        rows = []
        for beat in page.object_list:
            if beat.deregistered_at:
                state = "stopped"
            elif not getattr(beat, "lock_held", True):
                state = "gone"
            elif beat.heartbeat_at > alive_after:
                state = "live"
            else:
                state = "stale"
            rows.append({
                "name": beat.subscriber_name, "group": beat.consumer_group, "topic": beat.topic,
                "heartbeat": when(beat.heartbeat_at),
                "heartbeat_age": age((now_ms - beat.heartbeat_at) / 1000),
                "state": state,
            })
        return {
            "rows": rows,
            "page": page,
            "group": group,
            "topic": topic,
            "can_forget": self.has_forget_permission(request),
        }

    def has_forget_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "forget_group")

    def act(self, request: HttpRequest) -> None:
        if request.POST.get("action") != "forget" or not self.has_forget_permission(request):
            raise PermissionDenied
        group, topic = request.POST.get("group", ""), request.POST.get("topic", "")
        every_topic = request.POST.get("all_topics") == "1"
        if every_topic == bool(topic):
            # An empty topic field is not a choice of every topic: that is its own button.
            messages.error(request, "Name the topic to forget the group on, or choose "
                           "'all topics' (not both); nothing was forgotten.")
            return
        try:
            done = operations.forget(group, None if every_topic else topic, using=self.using(request))
        except (GroupInUse, UnknownGroup, operations.OperationError) as exc:
            messages.error(request, str(exc))
            return
        record(request, Subscriber,
               f"Forgot consumer group {done.group!r} on {', '.join(done.topics)}: "
               f"{done.watermarks} watermark(s), {done.deliveries} delivery row(s), "
               f"{done.leases} lease(s) and {done.heartbeats} heartbeat(s) deleted; it no "
               "longer holds garbage collection back.")
