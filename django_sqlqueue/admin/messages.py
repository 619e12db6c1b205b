"""The message log: every message, filterable by topic and partition, with each group's
delivery state on its detail page."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from .. import operations
from ..cancelling import CancelResult, CancelStatus, cancel
from ..conf import queue_database
from ..models import Cancellation, ConsumerOffset, LogSequencer, QueueMessage
from ..models.cancellations import ALL_GROUPS
from .actions import confirmation_page, confirmed, record
from .bounded import QueueModelAdmin
from .deliveries import deliveries
from .display import pre, pretty_json, when
from .filters import PartitionFilter, TopicFilter
from .paginator import CappedPaginator
from .reading import database_query

# Messages one "cancel" action handles at most (each is a short transaction of its own).
MAX_CANCEL = 1000
# The offsets ("lowest-highest") a cancel's confirmation page showed: confirmed, it cancels
# within them only, not messages published since into "everything the filter matches".
SHOWN_OFFSETS_FIELD = "sqlqueue_offsets"


@admin.register(QueueMessage)
class QueueMessageAdmin(QueueModelAdmin):
    list_display = ("offset", "topic", "partition", "key", "message_id", "position",
                    "published", "due", "dead_letter_of")
    list_filter = (TopicFilter, PartitionFilter)
    search_fields = ("=offset",)
    search_help_text = "An offset."
    ordering = ("-offset",)  # the primary key, read backwards; no other (admin/bounded.py)
    paginator = CappedPaginator
    show_full_result_count = False
    list_per_page = 50
    change_list_template = "admin/django_sqlqueue/change_list.html"
    change_form_template = "admin/django_sqlqueue/message_change_form.html"
    actions = ("cancel_messages",)
    fields = ("offset", "topic", "partition", "key", "message_id", "position", "published",
              "due", "dead_letter_of", "payload_pretty", "headers_pretty")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_search_results(self, request: HttpRequest, queryset: Any,
                           search_term: str) -> tuple[Any, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not (term.isdecimal() and term.isascii() and len(term) <= 18):
            return queryset.none(), False
        return queryset.filter(offset=int(term)), False

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        message = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if message is not None:
            now_ms = LogSequencer.objects.head(message._state.db or queue_database())[2]
            context["sqlqueue_deliveries"] = deliveries(message, now_ms)
            context["sqlqueue_cancelled_for_all"] = next(
                (c for c in Cancellation.objects.of_message(
                    message.topic, message.offset, message._state.db or queue_database())
                 if c.consumer_group == ALL_GROUPS), None)
            context["sqlqueue_can_deliver"] = self.has_deliver_permission(request)
            context["sqlqueue_deliver_url"] = _on_alias(reverse(
                "admin:django_sqlqueue_queuemessage_deliver", args=[message.offset]), request)
            context["sqlqueue_database_query"] = database_query(request)
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[Any]:
        deliver = self.admin_site.admin_view(require_POST(self.deliver_view))
        return [path("<int:offset>/deliver/", deliver,
                     name="django_sqlqueue_queuemessage_deliver"), *super().get_urls()]

    def deliver_view(self, request: HttpRequest, offset: int) -> HttpResponse:
        """Deliver now: the message, waiting out a delay or a backoff for one group, becomes
        deliverable to that group at once."""
        if not self.has_deliver_permission(request):
            raise PermissionDenied
        message = self.get_object(request, str(offset))
        if message is None:
            raise Http404(f"no message with offset {offset}")
        group = request.POST.get("group", "")
        try:
            changed = operations.deliver_now(group, message.topic, message.offset,
                                             by=f"admin:{request.user.get_username()}",
                                             using=message._state.db or queue_database())
        except operations.OperationError as exc:
            messages.error(request, str(exc))
        else:
            if changed:
                record(request, QueueMessage,
                       f"Message {message.offset} of {message.topic!r} is deliverable to "
                       f"consumer group {group!r} now.", object_id=str(message.offset))
            else:
                messages.info(request, f"Message {message.offset} was deliverable to {group!r} "
                              "already (or is running); nothing changed.")
        return HttpResponseRedirect(_on_alias(
            reverse("admin:django_sqlqueue_queuemessage_change", args=[message.offset]), request))

    def has_deliver_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "deliver_message")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "cancel_message")

    @admin.action(description="Cancel selected messages (for every consumer group)",
                  permissions=["cancel"])
    def cancel_messages(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        """Confirm first (how many, in which topics, for which groups); once confirmed,
        cancel each message that has not started, for all groups (those that register later
        too); a message already running is left alone and reported."""
        scope = queryset.order_by("-offset")  # newest first, as the page lists them
        shown = _shown_offsets(request)
        if shown is not None:
            scope = scope.filter(offset__gte=shown[0], offset__lte=shown[1])
        elif request.POST.get("select_across") == "1":
            # "Everything the filter matches" runs only on what a confirmation page showed.
            return self._confirm_cancel(request, scope)
        if not confirmed(request):
            return self._confirm_cancel(request, scope)
        by = f"admin:{request.user.get_username()}"
        cancelled: list[tuple[QueueMessage, CancelResult]] = []
        started: list[tuple[QueueMessage, CancelResult]] = []
        for message in scope[:MAX_CANCEL]:
            try:
                result = cancel(message.topic, message.message_id, key=message.message_key,
                                by=by, using=message._state.db or queue_database())
            except operations.OperationError as exc:
                messages.error(request, f"Message {message.offset}: {exc}")
                continue
            (cancelled if result.cancelled else started).append((message, result))
        if cancelled:
            record(request, QueueMessage,
                   f"Cancelled {len(cancelled)} message(s) for every consumer group: "
                   + ", ".join(str(m.offset) for m, _ in cancelled) + ".")
        for message, result in started:
            groups = ", ".join(f"{g} {s}" for g, s in sorted(result.groups.items())
                               if s is not CancelStatus.CANCELLED)
            messages.warning(request, f"Message {message.offset} was not cancelled for every "
                             f"group (started or handled already: {groups}); groups that had "
                             "not started it skip it.")
        return None

    def _confirm_cancel(self, request: HttpRequest, scope: Any) -> HttpResponse | None:
        """The confirmation page of a cancel: the messages per topic, each topic's
        registered groups, and what happens to the groups that register later."""
        rows = list(scope.values_list("offset", "topic")[:MAX_CANCEL + 1])
        if not rows:
            messages.info(request, "No message matches; nothing was cancelled.")
            return None
        beyond = len(rows) > MAX_CANCEL
        rows = rows[:MAX_CANCEL]
        per_topic = Counter(topic for _, topic in rows)
        groups: dict[str, list[str]] = {}
        for topic, group in (ConsumerOffset.objects.using(scope.db)
                             .filter(topic__in=list(per_topic))
                             .order_by("topic", "consumer_group")
                             .values_list("topic", "consumer_group").distinct()):
            groups.setdefault(topic, []).append(group)
        details = [
            f"{count} in topic {topic!r}, for "
            + (f"consumer group(s) {', '.join(groups[topic])} and any group registered later"
               if topic in groups else "any consumer group registered later (none yet)")
            for topic, count in sorted(per_topic.items())]
        lowest, highest = rows[-1][0], rows[0][0]
        warning = ("Each is cancelled for every consumer group of its topic, those that "
                   "register later too; a group that has started or handled one already "
                   "keeps it, and the page says which.")
        if beyond:
            warning = (f"More than {MAX_CANCEL} messages match: only the newest {MAX_CANCEL} "
                       f"(offsets {lowest} to {highest}) are cancelled; narrow the filter or "
                       "run the action again for the rest. " + warning)
        return confirmation_page(
            self, request, scope, "cancel_messages", "Cancel messages", "Cancel", len(rows),
            warning, details=details, hidden={SHOWN_OFFSETS_FIELD: f"{lowest}-{highest}"})

    # ----------------------------------------------------------------- columns

    @admin.display(description="partition")
    def partition(self, obj: QueueMessage) -> str:
        return obj.partition_key or "-"

    @admin.display(description="key")
    def key(self, obj: QueueMessage) -> str:
        return obj.message_key or "-"

    @admin.display(description="published")
    def published(self, obj: QueueMessage) -> str:
        return when(obj.published_at)

    @admin.display(description="due")
    def due(self, obj: QueueMessage) -> str:
        return when(obj.deliver_at) if obj.deliver_at > obj.published_at else "-"

    @admin.display(description="dead letter of")
    def dead_letter_of(self, obj: QueueMessage) -> str:
        if not obj.failed_at:
            return "-"
        return f"{obj.original_topic} #{obj.original_offset} ({obj.consumer_group})"

    @admin.display(description="payload")
    def payload_pretty(self, obj: QueueMessage) -> Any:
        return pre(pretty_json(obj.payload))

    @admin.display(description="headers")
    def headers_pretty(self, obj: QueueMessage) -> Any:
        return pre(pretty_json(obj.metadata))


def _shown_offsets(request: HttpRequest) -> tuple[int, int] | None:
    """The (lowest, highest) offsets a confirmation page showed, if it was posted back."""
    lowest, dash, highest = request.POST.get(SHOWN_OFFSETS_FIELD, "").partition("-")
    if not (dash and lowest.isdecimal() and highest.isdecimal() and lowest.isascii()
            and highest.isascii() and len(lowest) <= 18 and len(highest) <= 18):
        return None
    return int(lowest), int(highest)


def _on_alias(url: str, request: HttpRequest) -> str:
    """``url`` on the queue alias ``request`` shows (see admin/reading.py)."""
    query = database_query(request)
    return f"{url}?{query}" if query else url
