"""The overview: one row per topic and consumer group, readable at a glance.

Its figures come from :func:`django_sqlqueue.operations.overview`, the same rows as
``manage.py sqlqueue stats``; pause and resume call the operations of the same names.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.urls import path, reverse
from django.utils.http import urlencode

from .. import operations
from ..conf import queue_aliases
from ..models import Overview, QueueMessage
from .actions import record
from .charts import lag_bar, sparkline
from .display import age
from .pages import PageAdmin
from .reading import DATABASE_PARAMETER, queue_alias_for

OVERVIEW_URL_NAME = "django_sqlqueue_overview"
UNSEQUENCED_CAP = 10_000


@admin.register(Overview)
class OverviewAdmin(PageAdmin):
    template = "admin/django_sqlqueue/overview.html"

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.changelist_view)
        info = self.opts.app_label, self.opts.model_name
        # The overview's own name, and the changelist name the admin index links to.
        return [path("", view, name=OVERVIEW_URL_NAME),
                path("", view, name="{}_{}_changelist".format(*info))]

    def page_context(self, request: HttpRequest, using: str, now_ms: int) -> dict[str, Any]:
        stats = operations.overview(using=using)
        largest = max([row.lag for row in stats] + [1])
        dead_letters = reverse("admin:django_sqlqueue_deadletter_changelist")
        partitions = reverse("admin:django_sqlqueue_partition_changelist")
        # The alias this page shows, carried to the pages it links to.
        on_alias = {DATABASE_PARAMETER: alias} if (alias := queue_alias_for(request)) != (
            queue_aliases()[0]) else {}
        rows = [{
            "topic": row.topic,
            "group": row.group,
            "lag": row.lag,
            "lag_estimated": row.lag_estimated,
            "dead_letters_capped": row.dead_letters_capped,
            "lag_bar": lag_bar(row.lag, largest),
            "in_flight": row.in_flight,
            "dead_letters": row.dead_letters,
            "dead_letters_url": dead_letters + "?" + urlencode(
                {"original_topic": row.topic, "consumer_group": row.group, **on_alias}),
            "partitions_url": partitions + "?" + urlencode(
                {"group": row.group, "topic": row.topic, **on_alias}),
            "oldest": age(row.oldest_pending_age_seconds),
            "workers": row.workers,
            "paused": row.paused,
            "spark": sparkline(row.handled_per_minute),
            "handled_last_hour": sum(row.handled_per_minute),
            "failed_last_hour": sum(row.failed_per_minute),
            "trouble": bool(row.dead_letters or (row.lag and (row.workers == 0 or row.paused))),
        } for row in stats]
        limits = [{
            "scope": row.scope,
            "running": row.running,
            "max_running": row.max_running,
            "full": row.max_running is not None and row.running >= row.max_running,
            "rate": row.rate,
            "tokens": row.tokens,
            "per_key": ", ".join(filter(None, [
                f"{row.max_running_per_key} running" if row.max_running_per_key else "",
                row.rate_per_key or ""])),
            "keys_running": row.keys_running,
            "key_slots_running": row.key_slots_running,
            "keyed_buckets": row.keyed_buckets,
        } for row in operations.limits_overview(using)]
        for unclaimed in operations.unclaimed_topics(using=using):
            messages.warning(request, unclaimed.line)  # listed nowhere else on this page
        return {
            "rows": rows,
            "limits": limits,
            # Lag counts sequenced messages only; with no worker running nothing is
            # sequenced, so messages published meanwhile would not show anywhere else.
            "unsequenced": QueueMessage.objects.unsequenced_count(UNSEQUENCED_CAP + 1, using),
            "unsequenced_cap": UNSEQUENCED_CAP,
            "lagging": sum(1 for row in stats if row.lag),
            "dead_letter_total": sum(row.dead_letters for row in stats),
            "without_workers": sum(1 for row in stats if row.workers == 0),
            "paused_count": sum(1 for row in stats if row.paused),
            "can_pause": self.may(request, "pause_group"),
            "can_resume": self.may(request, "resume_group"),
        }

    def act(self, request: HttpRequest) -> None:
        action = request.POST.get("action")
        group, topic = request.POST.get("group", ""), request.POST.get("topic", "")
        if action not in ("pause", "resume") or not self.may(request, f"{action}_group"):
            raise PermissionDenied
        by = f"admin:{request.user.get_username()}"
        try:
            if action == "pause":
                changed = operations.pause(group, topic, by=by, using=self.using(request))
            else:
                changed = operations.resume(group, topic, by=by, using=self.using(request))
        except operations.OperationError as exc:
            messages.error(request, str(exc))
            return
        if not changed:
            messages.info(request, f"Consumer group {group!r} on {topic!r} was already "
                          f"{'paused' if action == 'pause' else 'running'}; nothing changed.")
            return
        if action == "pause":
            text = (f"Paused consumer group {group!r} on topic {topic!r}: its workers take no "
                    "new deliveries of it from their next poll; publishing goes on.")
        else:
            text = f"Resumed consumer group {group!r} on topic {topic!r}."
        record(request, Overview, text)
