"""Two JSON endpoints for ``make demo-embedded``: place an order, and see who handled it.

Placing an order is a POST without a CSRF token here because the demo calls it from a
script; a real form or API would keep Django's CSRF protection.
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation

from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .models import Order
from .services import place_order


@csrf_exempt
@require_POST
def place(request: HttpRequest) -> JsonResponse:
    """Place an order for ``customer`` of ``total``; the web process's pid comes back too."""
    try:
        total = Decimal(request.POST.get("total", ""))
    except InvalidOperation:
        return JsonResponse({"error": "total must be a decimal number"}, status=400)
    order = place_order(request.POST.get("customer", "anonymous"), total)
    return JsonResponse({"order": order.pk, "web_pid": os.getpid()}, status=201)


@require_GET
def detail(request: HttpRequest, pk: int) -> JsonResponse:
    """An order's status and the handler runs it had: group, attempt, the pid they ran in."""
    order = get_object_or_404(Order, pk=pk)
    runs = [{"group": run.group, "attempt": run.attempt, "pid": run.worker_pid,
             "succeeded": run.succeeded} for run in order.handler_runs.order_by("pk")]
    return JsonResponse({"order": order.pk, "status": order.status, "runs": runs})
