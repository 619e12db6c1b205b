"""What every admin page of the app reads: its own order, its declared filters, nothing else.

Django's changelist takes more from the query string than the page offers: ``?o=N`` sorts
by any column even with ``sortable_by = ()``, and any ``?<field>__<lookup>=`` on a local
field is applied as given (``payload__icontains``, ``last_error__iregex``). On a log of
millions of rows either is a full scan per page view, open to any staff user who may look.
So each page keeps the order of the index it reads (``?o=`` is ignored), and a parameter
that none of its declared filters takes is refused with a 400, as Django refuses the lookups
it disallows. Every ModelAdmin of the app derives from :class:`QueueModelAdmin`.

The same class makes every action need the view permission of the page it acts from: a
permission to act is never a permission to act blind.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.contrib.auth import get_permission_codename
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from .reading import DATABASE_PARAMETER, database_choices, database_for


class BoundedChangeList(ChangeList):
    """Django's changelist, in the admin's own order and with its declared filters only."""

    def get_ordering(self, request: HttpRequest, queryset: Any) -> list[Any]:
        # The page's ordering follows one of the log's indexes; ?o= would sort every
        # matching row before the first page could be read. This is the first read of the
        # parameter, so dropping it here also keeps the headers from showing a sort.
        self.params.pop(ORDER_VAR, None)
        return list(super().get_ordering(request, queryset))

    def get_filters_params(self, params: Any = None) -> Any:
        # ?database= picks the queue alias the page reads (admin/reading.py), not a filter;
        # it stays in self.params, so the page's own links keep it.
        lookups = super().get_filters_params(params)
        lookups.pop(DATABASE_PARAMETER, None)
        return lookups

    def get_filters(self, request: HttpRequest) -> Any:
        # Each list filter takes its own parameters out of the query string; what is left
        # would be applied as a lookup on the table, unbounded.
        specs, has_filters, remaining, duplicates, active = super().get_filters(request)
        if remaining:
            raise DisallowedModelAdminLookup(
                f"Filtering by {', '.join(sorted(remaining))} is not allowed: this page "
                "filters only through its own filters and search box")
        return specs, has_filters, remaining, duplicates, active


class QueueModelAdmin(admin.ModelAdmin):
    """The base of every ModelAdmin of the app: bounded reads, view before action."""

    sortable_by = ()
    show_facets = admin.ShowFacets.NEVER  # facet counts would COUNT(*) every filter choice

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The queue's own database, whatever the routers say (the system checks ask them
        # to agree with SQLQUEUE["DATABASE"]); its read replica for a page that only
        # looks (admin/reading.py). Objects read remember their alias (``_state.db``), and
        # the detail pages read the rest of what they show from there.
        return super().get_queryset(request).using(database_for(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return BoundedChangeList

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None,
                        ) -> HttpResponse:
        # Where SQLQUEUE["TOPICS"] places topics on several aliases: which one is shown.
        context = {"sqlqueue_databases": database_choices(request), **(extra_context or {})}
        response: HttpResponse = super().changelist_view(request, context)
        return response

    def get_sortable_by(self, request: HttpRequest) -> tuple[str, ...]:
        return ()

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The view permission itself: Django also lets "change" imply "view", and here the
        # change permissions name operations (pausing a schedule), not a way of looking.
        codename = get_permission_codename("view", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def may(self, request: HttpRequest, codename: str) -> bool:
        """Whether the user may run the operation ``codename`` from this page: its own
        permission, and the view permission of the rows it acts on."""
        return (self.has_view_permission(request)
                and request.user.has_perm(f"{self.opts.app_label}.{codename}"))
