"""Recurring schedules: Django's changelist with their next and last run, and pause and
resume as actions (the same operations as ``manage.py sqlqueue schedules``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from .. import operations
from ..models import Schedule
from .actions import record
from .bounded import QueueModelAdmin
from .display import pre, pretty_json, when


@admin.register(Schedule)
class ScheduleAdmin(QueueModelAdmin):
    list_display = ("name", "cron", "timezone", "target", "next_run", "last_run",
                    "last_message", "paused", "origin", "reason")
    list_filter = ("paused", "origin")
    search_fields = ("name",)
    ordering = ("name",)
    list_per_page = 100
    actions = ("pause_schedules", "resume_schedules")
    fields = ("name", "cron", "timezone", "catch_up", "target", "next_run", "last_run",
              "last_message", "paused", "origin", "reason", "definition_pretty")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # declared in settings, or added with django_sqlqueue.schedules.add()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # settings schedules would come back; pause instead

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return self.may(request, "change_schedule")

    @admin.action(description="Pause the selected schedules", permissions=["pause"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set(request, queryset, operations.pause_schedule, "paused")

    @admin.action(description="Resume the selected schedules from their next tick",
                  permissions=["pause"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set(request, queryset, operations.resume_schedule, "resumed")

    def _set(self, request: HttpRequest, queryset: QuerySet[Any], operate: Any,
             verb: str) -> None:
        using = queryset.db
        names = list(queryset.values_list("name", flat=True))
        changed = [name for name in names if operate(name, using=using)]
        record(request, Schedule, f"{verb} {len(changed)} of {len(names)} schedule(s)"
               + (f": {', '.join(changed)}" if changed else ""))

    @admin.display(description="next run")
    def next_run(self, obj: Schedule) -> str:
        return when(obj.next_run_at)

    @admin.display(description="last run")
    def last_run(self, obj: Schedule) -> str:
        return when(obj.last_run_at)

    @admin.display(description="definition")
    def definition_pretty(self, obj: Schedule) -> SafeString:
        return pre(pretty_json(obj.definition))
