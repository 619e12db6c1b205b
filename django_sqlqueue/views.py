"""The Prometheus endpoint for the database-derived gauges (see django_sqlqueue.metrics)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from .metrics import MISSING, available

_registries: dict[str, Any] = {}


def metrics(request: HttpRequest, using: str = "default") -> HttpResponse:
    """Serve ``sqlqueue_*`` gauges of every consumer group, read at request time.

    It shows group and topic names: protect the URL as you would any internal page.
    """
    if not available():
        return HttpResponse(MISSING + "\n", status=501, content_type="text/plain")
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from .metrics.database import DatabaseCollector

    registry = _registries.get(using)
    if registry is None:
        registry = CollectorRegistry(auto_describe=True)
        registry.register(DatabaseCollector(using))
        _registries[using] = registry
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
