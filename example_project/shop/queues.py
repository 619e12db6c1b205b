"""Message handlers for the queue worker: one function per (topic, consumer group).

Two consumer groups read the same ``orders`` topic independently: billing charges the
order, emails sends a confirmation. Each keeps its own progress, retries and dead letters.
Handlers must be idempotent, because delivery is at-least-once.
"""

from __future__ import annotations

import os

from django.db import transaction

import django_sqlqueue as sqlqueue

from .models import HandlerRun, Order

# Quick retries so the demo's poison order reaches the dead-letter topic in about a second.
DEMO_BACKOFF = sqlqueue.ExponentialBackoff(base=0.2, cap=1.0)


@sqlqueue.subscriber("orders", group="billing", max_attempts=3, backoff=DEMO_BACKOFF)
def charge_customer(message: sqlqueue.Message) -> None:
    order = Order.objects.get(pk=message.payload["order_id"])
    if order.total <= 0:
        _record("billing", order, message, succeeded=False)
        raise ValueError(f"cannot charge a total of {order.total}")
    with transaction.atomic():
        # Idempotent: a redelivered message finds the order already paid and changes nothing.
        Order.objects.filter(pk=order.pk, status=Order.Status.PLACED).update(
            status=Order.Status.PAID
        )
        _record("billing", order, message, succeeded=True)


@sqlqueue.subscriber("orders", group="emails", backoff=DEMO_BACKOFF)
def send_confirmation(message: sqlqueue.Message) -> None:
    order = Order.objects.get(pk=message.payload["order_id"])
    # A real handler would send an email here, keyed by message.id so a retry sends none twice.
    _record("emails", order, message, succeeded=True)


def _record(group: str, order: Order, message: sqlqueue.Message, *, succeeded: bool) -> None:
    HandlerRun.objects.create(
        group=group, order=order, message_offset=message.offset, attempt=message.attempt,
        worker_pid=os.getpid(), succeeded=succeeded,
    )
