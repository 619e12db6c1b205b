"""Placing orders. Each order's ``orders`` message is published in the order's transaction.

publish() writes on the same connection, inside the same ``transaction.atomic`` block, so
the message exists exactly when the order does: if anything in the block raises, both roll
back; once it commits, a worker will see the message.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from django.db import transaction

import django_sqlqueue as sqlqueue

from .models import Order

TOPIC = "orders"


def place_order(customer: str, total: Decimal) -> Order:
    """Create an order and publish its "placed" message, atomically."""
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=total)
        sqlqueue.publish(
            TOPIC,
            # Decimal as a string: most JSON consumers would read a number as a float.
            {"order_id": order.pk, "customer": customer, "total": str(order.total)},
            # One customer's messages are handled in order, by one worker at a time.
            key=f"customer-{customer}",
            # The idempotency id: publishing it again (say, a retried request) is a no-op.
            id=f"order-{order.pk}-placed",
        )
    return order


def place_orders_in_bulk(orders: Iterable[tuple[str, Decimal]]) -> list[Order]:
    """Create several orders, then publish all their messages with one publish_many call."""
    with transaction.atomic():
        created = [Order.objects.create(customer=c, total=t) for c, t in orders]
        sqlqueue.publish_many(
            TOPIC,
            [
                {
                    "payload": {
                        "order_id": order.pk,
                        "customer": order.customer,
                        "total": str(order.total),
                    },
                    "key": f"customer-{order.customer}",
                    "id": f"order-{order.pk}-placed",
                }
                for order in created
            ],
        )
    return created
