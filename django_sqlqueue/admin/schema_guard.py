"""The admin's pages of this app before ``manage.py migrate``: one line, not a server error.

Every view of this app's ModelAdmins is wrapped: a database whose queue tables are missing
or behind this app's migrations gets a short page (status 503) saying so and naming
``manage.py migrate``, whether that is known before the view runs (the migration plan:
the migration files, loaded once, and one read of ``django_migrations``, about a
millisecond, until the process has found the alias migrated) or met while it runs or
renders (a table or column that does not exist).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import admin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse
from django.urls import URLPattern
from django.utils.html import escape

from ..conf import queue_database
from ..db.schema_state import APP_LABEL, is_missing_schema, migrate_line, not_migrated_line

NOT_READY_STATUS = 503
# Aliases found migrated by this process: the plan is read until then, never after (a
# deploy with new migrations starts new processes). A table found missing later, while a
# view runs, still gets the one line, and the alias is looked at afresh.
_ready: set[str] = set()


def guard_admin_pages(site: admin.AdminSite = admin.site) -> None:
    """Wrap the views of every ModelAdmin of this app registered on ``site``."""
    for model, model_admin in list(site._registry.items()):
        if model._meta.app_label == APP_LABEL and not getattr(model_admin, "_schema_guarded", False):
            model_admin.get_urls = _guarded_urls(model_admin.get_urls)  # type: ignore[method-assign]
            model_admin._schema_guarded = True  # type: ignore[attr-defined]


def _guarded_urls(get_urls: Callable[[], list[Any]]) -> Callable[[], list[Any]]:
    def guarded() -> list[Any]:
        patterns = get_urls()
        for pattern in patterns:
            if isinstance(pattern, URLPattern):
                pattern.callback = _guarded_view(pattern.callback)
        return patterns

    return guarded


def _guarded_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = getattr(request, "user", None)
        if not (user is not None and user.is_active and user.is_staff):
            return view(request, *args, **kwargs)  # the admin's login page, as before
        using = queue_database()
        if using not in _ready:
            line = migrate_line(using)
            if line is not None:
                return _not_ready(line)
            _ready.add(using)
        try:
            response = view(request, *args, **kwargs)
            # A TemplateResponse queries while it renders: render it here, inside the guard.
            if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                response.render()
        except DatabaseError as exc:
            if not is_missing_schema(exc):
                raise
            _ready.discard(using)
            return _not_ready(not_migrated_line(using))
        return response

    return guarded


def _not_ready(line: str) -> HttpResponse:
    return HttpResponse(
        "<!DOCTYPE html><html><head><title>SQL queue: not migrated</title></head><body>"
        f"<h1>SQL queue</h1><p class=\"errornote\">{escape(line)}</p></body></html>",
        status=NOT_READY_STATUS,
    )
