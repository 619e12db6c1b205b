"""The test helpers in Django's test runner style: ``TestCase`` (the whole test in one
transaction, rolled back at its end) and ``TransactionTestCase``.

In a ``TestCase`` nothing is ever committed, so ``drain()`` must do all its work on the
test's own connection, inside the test's transaction: sequencing, leases, delivery rows,
the handlers' own writes and their visibility extensions.
"""

from __future__ import annotations

from django.db import transaction
from django.test import TestCase, TransactionTestCase

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.registry import unregister
from django_sqlqueue.models import QueueMessage
from django_sqlqueue.testing import captured, drain
from tests.testapp.models import Handled

TOPIC = "helpers.testcase"
GROUP = "accounting"


def handle(message: sqlqueue.Message) -> None:
    """Record the run; the payload may ask for a failing statement or an extension."""
    action = message.payload.get("action")
    if action == "duplicate" and message.attempt == 1:
        # A statement the database refuses: on PostgreSQL it aborts the transaction
        # it runs in, here the test's own.
        Handled.objects.create(id=1, group="x", topic="x", key="", offset=0, message_id="",
                               attempt=0, pid=0, handled_at=0)
        Handled.objects.create(id=1, group="x", topic="x", key="", offset=0, message_id="",
                               attempt=0, pid=0, handled_at=0)
    if action == "extend":
        with transaction.atomic():
            message.extend_visibility(600)
    Handled.objects.create(group=message.group, topic=message.topic, key=message.key,
                           offset=message.offset, message_id=message.id,
                           payload=message.payload, attempt=message.attempt, pid=0,
                           handled_at=0)


def setUpModule() -> None:  # noqa: N802 - unittest's name
    sqlqueue.subscriber(TOPIC, group=GROUP, backoff=sqlqueue.ExponentialBackoff(base=5))(handle)


def tearDownModule() -> None:  # noqa: N802 - unittest's name
    unregister(TOPIC, GROUP)


def place(action: str = "") -> sqlqueue.StoredMessage:
    """What the code under test does: publish in its own transaction."""
    with transaction.atomic():
        return sqlqueue.publish(TOPIC, {"action": action}, key="order-1")


class DrainInATestCase(TestCase):
    def test_a_message_published_in_the_test_transaction_is_handled_in_it(self):
        with captured() as box:
            stored = place()

        result = drain(TOPIC)

        box.assert_published(TOPIC, key="order-1", payload={"action": ""})
        self.assertEqual(result.handled, 1)
        self.assertEqual(list(Handled.objects.values_list("offset", "attempt")),
                         [(stored.offset, 1)])

    def test_draining_twice_runs_each_message_once(self):
        place()
        drain(TOPIC)
        place()

        self.assertEqual(drain(TOPIC).handled, 1)
        self.assertEqual(Handled.objects.count(), 2)

    def test_a_statement_the_database_refuses_fails_the_handler_not_the_test(self):
        place("duplicate")

        result = drain(TOPIC, advance_delays=True)

        self.assertEqual((result.retried, result.handled), (1, 1))
        self.assertIn("IntegrityError", result.failures[0].error)
        # The test's transaction goes on: the failed attempt's writes are undone, the
        # second attempt's are there.
        self.assertEqual(list(Handled.objects.values_list("attempt", flat=True)), [2])
        self.assertTrue(QueueMessage.objects.filter(topic=TOPIC).exists())

    def test_a_handler_extends_its_visibility_inside_its_own_atomic_block(self):
        place("extend")

        result = drain(TOPIC)

        self.assertEqual((result.handled, result.failures), (1, []))


class DrainInATransactionTestCase(TransactionTestCase):
    def test_committed_messages_are_handled_and_their_writes_committed(self):
        place()
        place()

        result = drain(TOPIC)

        self.assertEqual(result.handled, 2)
        self.assertEqual(Handled.objects.count(), 2)

    def test_a_handler_extends_its_visibility_inside_its_own_transaction(self):
        place("extend")

        result = drain(TOPIC)

        self.assertEqual((result.handled, result.failures), (1, []))
