"""The shop's tests, with the queue's test helpers (docs/testing.md):

    python example_project/manage.py test shop

``captured()`` shows what placing an order published; ``drain()`` runs the shop's
handlers (shop/queues.py) and tasks (shop/tasks.py) right here, in the test's transaction,
as a worker would: retries, dead letters and all.
"""

from __future__ import annotations

from decimal import Decimal
from unittest import skipIf

from django.test import TestCase

from django_sqlqueue.models import QueueMessage
from django_sqlqueue.testing import captured, drain

from .models import HandlerRun, Order
from .services import place_order, place_orders_in_bulk
from .tasks import send_receipt


class PlacingOrdersTests(TestCase):
    def test_placing_an_order_publishes_its_placed_message(self):
        with captured() as box:
            order = place_order("ada", Decimal("12.50"))

        box.assert_published(
            "orders", key="customer-ada",
            payload={"order_id": order.pk, "customer": "ada", "total": "12.50"},
        )

    def test_orders_placed_in_bulk_publish_one_message_each(self):
        with captured() as box:
            orders = place_orders_in_bulk([("ada", Decimal("1")), ("bob", Decimal("2"))])

        self.assertEqual([p["order_id"] for p in box.payloads("orders")],
                         [o.pk for o in orders])


class HandlingOrdersTests(TestCase):
    def test_billing_charges_the_order_and_emails_confirm_it(self):
        order = place_order("ada", Decimal("12.50"))

        result = drain("orders")

        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.PAID)
        self.assertEqual(sorted(order.handler_runs.values_list("group", flat=True)),
                         ["billing", "emails"])
        self.assertEqual(result.handled, 2)

    def test_an_order_that_cannot_be_charged_is_retried_then_dead_lettered(self):
        order = place_order("eve", Decimal("0"))

        # The retries back off (shop/queues.py): advance_delays runs them without waiting.
        result = drain("orders", group="billing", advance_delays=True)

        self.assertEqual(result.topic("orders").dead_lettered, 1)
        self.assertEqual(HandlerRun.objects.filter(order=order, succeeded=False).count(), 3)
        self.assertTrue(QueueMessage.objects.filter(topic="orders_dlq").exists())


@skipIf(send_receipt is None, "needs Django's Tasks framework (Django 6, or django-tasks)")
class ReceiptTaskTests(TestCase):
    def test_the_receipt_task_runs_and_returns_the_receipt(self):
        order = place_order("ada", Decimal("12.50"))
        with captured() as box:
            result = send_receipt.enqueue(order.pk)
        box.assert_enqueued(send_receipt, args=[order.pk])

        drain("tasks.default")

        self.assertEqual(send_receipt.get_result(result.id).return_value,
                         f"receipt for order #{order.pk}: 12.50 paid by ada")
