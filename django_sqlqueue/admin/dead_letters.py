"""The dead letters: Django's changelist over the log's dead-letter copies."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.safestring import SafeString

from .. import operations
from ..models import DeadLetter
from .actions import confirmation_page, confirmed, record
from .bounded import QueueModelAdmin
from .display import first_line, pre, pretty_json, when
from .filters import ConsumerGroupFilter, FailedFilter, OriginalTopicFilter
from .paginator import CappedPaginator
from .search import search_dead_letters

NOTES_ATTRIBUTE = "_sqlqueue_notes"  # where a request carries its search notes to the page
ACTION_BATCH = 1_000  # dead letters handed to one replay or discard call


@admin.register(DeadLetter)
class DeadLetterAdmin(QueueModelAdmin):
    list_display = ("offset", "original_topic", "consumer_group", "key", "attempts",
                    "error", "failed")
    list_display_links = ("offset",)
    list_filter = (OriginalTopicFilter, ConsumerGroupFilter, FailedFilter)
    # The search box; get_search_results reads it its own way (see admin/search.py).
    search_fields = ("message_key",)
    search_help_text = ("An id (offset), a key, a message id, error text, or payload fields "
                        "such as customer_id=42.")
    # The queue_msg_dead_letters index, read backwards; no other order is offered (see
    # admin/bounded.py): it would sort the dead letters in full.
    ordering = ("-failed_at", "-offset")
    paginator = CappedPaginator
    show_full_result_count = False  # no COUNT(*) over every dead letter
    list_per_page = 50
    change_list_template = "admin/django_sqlqueue/change_list.html"
    fieldsets = (
        (None, {"fields": ("offset", "original_topic", "consumer_group", "key", "partition",
                           "attempts", "failed", "published", "original", "copy_id")}),
        ("Payload", {"fields": ("payload_pretty", "headers_pretty")}),
        ("Error", {"fields": ("full_error",)}),
    )
    actions = ("replay_dead_letters", "discard_dead_letters")
    readonly_fields = ("offset", "original_topic", "consumer_group", "key", "partition",
                       "attempts", "failed", "published", "original", "copy_id",
                       "payload_pretty", "headers_pretty", "full_error")

    # ----------------------------------------------------------------- read-only

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # discarding is an action with a permission of its own

    # ----------------------------------------------------------------- actions

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "replay_deadletter")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "discard_deadletter")

    @admin.action(description="Replay to the group that gave up on them", permissions=["replay"])
    def replay_dead_letters(self, request: HttpRequest,
                            queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._run(request, queryset, "replay_dead_letters", replay=True)

    @admin.action(description="Discard for good", permissions=["discard"])
    def discard_dead_letters(self, request: HttpRequest,
                             queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._run(request, queryset, "discard_dead_letters", replay=False)

    def _run(self, request: HttpRequest, queryset: QuerySet[Any], action: str,
             replay: bool) -> HttpResponse | None:
        """Confirm first (count and sample); once confirmed, hand the matching dead letters
        to the operation in batches of ids, lowest first. Each batch goes by id, so what
        runs is exactly what the filter matched, payload search included."""
        queryset = queryset.order_by()
        if not confirmed(request):
            count = queryset.count()
            if replay:
                return confirmation_page(
                    self, request, queryset.order_by("-failed_at", "-offset"), action,
                    "Replay dead letters", "Replay", count,
                    "Each is appended to its original topic again and delivered only to the "
                    "group that gave up on it; the dead letter is then gone.")
            return confirmation_page(
                self, request, queryset.order_by("-failed_at", "-offset"), action,
                "Discard dead letters", "Discard", count,
                "They are deleted for good; no group will see them again.")
        done = skipped = 0
        operate = operations.replay if replay else operations.discard
        using = queryset.db
        # Newest first, in the order of the dead-letter indexes (each ends in failed_at,
        # offset), going on after the last row of the previous batch: no batch sorts what is
        # left, and dead letters the operation skips are not read again.
        page = queryset.order_by("-failed_at", "-offset")
        while True:
            rows = list(page.values_list("failed_at", "offset")[:ACTION_BATCH])
            if not rows:
                break
            try:
                outcome = operate(operations.DeadLetterFilter(ids=tuple(o for _, o in rows)),
                                  using=using)
            except operations.OperationError as exc:
                # Batches already done stay done; say how far it got.
                messages.error(request, f"Stopped after {done} dead letter(s): {exc}")
                break
            done += outcome.replayed if replay else outcome.discarded
            skipped += outcome.skipped
            failed_at, offset = rows[-1]
            page = queryset.filter(
                Q(failed_at__lt=failed_at) | Q(failed_at=failed_at, offset__lt=offset)
            ).order_by("-failed_at", "-offset")
        if replay:
            text = (f"Replayed {done} dead letter{'s' if done != 1 else ''} to the consumer "
                    "group that gave up on each.")
            if skipped:
                text += (f" Skipped {skipped} whose group is no longer registered for its "
                         "topic.")
        else:
            text = f"Discarded {done} dead letter{'s' if done != 1 else ''}."
        if done or not skipped:
            record(request, DeadLetter, text)
        else:
            messages.warning(request, text)
        return None

    # ----------------------------------------------------------------- search

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        if not search_term.strip():
            return queryset, False
        queryset, notes = search_dead_letters(queryset, search_term)
        getattr(request, NOTES_ATTRIBUTE, []).extend(notes.messages())
        return queryset, False

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        notes: list[str] = []
        setattr(request, NOTES_ATTRIBUTE, notes)
        return super().changelist_view(request, {**(extra_context or {}),
                                                  "sqlqueue_notes": notes})

    # ----------------------------------------------------------------- columns

    @admin.display(description="id", ordering="offset")
    def offset_display(self, obj: DeadLetter) -> int:
        return obj.offset

    @admin.display(description="key")
    def key(self, obj: DeadLetter) -> str:
        return obj.message_key or "-"

    @admin.display(description="partition")
    def partition(self, obj: DeadLetter) -> str:
        return obj.partition_key or "-"

    @admin.display(description="attempts")
    def attempts(self, obj: DeadLetter) -> int:
        return obj.failure_count

    @admin.display(description="last error")
    def error(self, obj: DeadLetter) -> str:
        return first_line(obj.last_error)

    @admin.display(description="failed")
    def failed(self, obj: DeadLetter) -> str:
        return when(obj.failed_at)

    @admin.display(description="published")
    def published(self, obj: DeadLetter) -> str:
        return when(obj.published_at)

    @admin.display(description="original message")
    def original(self, obj: DeadLetter) -> str:
        return f"offset {obj.original_offset}, id {obj.original_id or '-'}"

    @admin.display(description="dead-letter id")
    def copy_id(self, obj: DeadLetter) -> str:
        return f"{obj.topic} / {obj.message_id}"

    @admin.display(description="payload")
    def payload_pretty(self, obj: DeadLetter) -> SafeString:
        return pre(pretty_json(obj.payload))

    @admin.display(description="headers")
    def headers_pretty(self, obj: DeadLetter) -> SafeString:
        return pre(pretty_json(obj.metadata))

    @admin.display(description="error")
    def full_error(self, obj: DeadLetter) -> SafeString:
        return pre(obj.last_error)
