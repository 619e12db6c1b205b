"""A Django task run by the queue's workers (TASKS in settings.py; see docs/tasks.md).

Django's Tasks framework is in Django 6.0+; on Django 5.2 it needs the django-tasks
backport. Without either, the demo skips its task step.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Count, Sum

from .models import Order

try:
    from django.tasks import task
except ImportError:  # Django 5.2
    try:
        from django_tasks import task  # type: ignore[no-redef,import-not-found,unused-ignore]
    except ImportError:
        task = None

send_receipt: Any = None
sales_report: Any = None

if task is not None:

    @task(queue_name="default")
    def send_receipt(order_id: int) -> str:  # type: ignore[no-redef]
        """Stands in for e-mailing a receipt; returns what it would have sent."""
        order = Order.objects.get(pk=order_id)
        return f"receipt for order #{order.pk}: {order.total} paid by {order.customer}"

    @task(queue_name="default")
    def sales_report() -> str:  # type: ignore[no-redef]
        """Run by the "sales-report" schedule (SQLQUEUE["SCHEDULES"] in settings.py)."""
        totals = Order.objects.aggregate(count=Count("pk"), total=Sum("total"))
        total = Decimal(totals["total"] or 0).quantize(Decimal("0.01"))
        return f"{totals['count']} orders, {total} in total"
