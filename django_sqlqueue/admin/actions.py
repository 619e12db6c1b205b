"""What every operator action does around its operation: confirm, record, report.

An action on "everything the filter matches" may touch a hundred thousand dead letters,
so a bulk action first shows a page with the count and a sample and runs only when that
page is posted back. Each run is recorded in Django's admin log (one entry naming what was
done and to how many) and reported to the user in a message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import django
from django.contrib import messages
from django.contrib.admin import ModelAdmin, helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

CONFIRM_FIELD = "sqlqueue_confirm"
SAMPLE_SIZE = 10  # rows shown on a confirmation page


def record(request: HttpRequest, model: type[Model], text: str, object_id: str | None = None) -> None:
    """One admin log entry for an operator action, and the same text as a message."""
    user_id = request.user.pk
    if user_id is not None:
        LogEntry.objects.create(
            user_id=user_id,
            content_type=ContentType.objects.get_for_model(model, for_concrete_model=False),
            object_id=object_id,
            object_repr=text[:200],
            action_flag=CHANGE,
            change_message=text,
        )
    messages.success(request, text)


def confirmed(request: HttpRequest) -> bool:
    """Whether the action's confirmation page was posted back."""
    return request.POST.get(CONFIRM_FIELD) == "yes"


def confirmation_page(model_admin: ModelAdmin, request: HttpRequest, queryset: QuerySet[Any],
                      action: str, title: str, verb: str, count: int,
                      warning: str = "", details: Sequence[str] = (),
                      hidden: Mapping[str, str] | None = None) -> TemplateResponse:
    """The page that shows what an action would touch and runs it when posted back.

    It posts the same form fields again (the action, the selection or ``select_across``)
    to the same URL, which keeps the changelist's filters in its query string; ``hidden``
    adds fields of the action's own (what the page showed, to run on exactly that).
    ``details`` are lines describing the scope (per topic, say).
    """
    opts = model_admin.model._meta
    sample = list(queryset[:SAMPLE_SIZE])
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "sqlqueue_list_breadcrumbs": django.VERSION >= (6, 0),
        "verb": verb,
        "count": count,
        "sample": sample,
        "more": count - len(sample),
        "warning": warning,
        "details": list(details),
        "hidden": sorted((hidden or {}).items()),
        "action": action,
        "select_across": request.POST.get("select_across") == "1",
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "confirm_field": CONFIRM_FIELD,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/django_sqlqueue/action_confirmation.html", context)
