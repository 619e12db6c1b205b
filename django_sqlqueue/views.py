"""The Prometheus endpoint for the database-derived gauges (see django_sqlqueue.metrics)."""

from __future__ import annotations

import hmac
from typing import Any

from django.http import HttpRequest, HttpResponse

from .conf import get_settings, queue_aliases
from .metrics import MISSING, available

_collectors: dict[str, Any] = {}  # database alias -> (registry, DatabaseCollector)


def metrics(request: HttpRequest, using: str | None = None) -> HttpResponse:
    """Serve ``sqlqueue_*`` gauges of every consumer group, read from the database at most
    once per ``SQLQUEUE["METRICS_CACHE_SECONDS"]``.

    With ``SQLQUEUE["METRICS_TOKEN"]`` set, only requests carrying
    ``Authorization: Bearer <token>`` are served (401 without it, 403 with another token).
    Without it the view serves anyone who can reach it: it shows group and topic names, so
    protect the URL as you would any internal page.
    """
    refused = _refuse(request)
    if refused is not None:
        return refused
    if not available():
        return HttpResponse(MISSING + "\n", status=501, content_type="text/plain")
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    registry, _ = collector(using)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def collector(using: str | None = None) -> tuple[Any, Any]:
    """The registry and the database collector serving ``using`` (one per process); without
    it, every queue alias (SQLQUEUE["TOPICS"] may place topics on several)."""
    cache_key = using or ",".join(queue_aliases())
    found = _collectors.get(cache_key)
    if found is None:
        from prometheus_client import CollectorRegistry

        from .metrics.database import DatabaseCollector

        found = (CollectorRegistry(auto_describe=True), DatabaseCollector(using))
        found[0].register(found[1])
        _collectors[cache_key] = found
    return found


def _refuse(request: HttpRequest) -> HttpResponse | None:
    token = get_settings().metrics_token
    if token is None:
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        response = HttpResponse("This endpoint needs 'Authorization: Bearer <token>' "
                                "(SQLQUEUE['METRICS_TOKEN']).\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="sqlqueue metrics"'
        return response
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return HttpResponse("Wrong metrics token.\n", status=403, content_type="text/plain")
    return None
