"""Cancelling from ``manage.py sqlqueue cancel`` and from the admin's message log: what
each prints or shows, exit statuses, one line for bad input, and who may cancel."""

from __future__ import annotations

import io

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import Cancellation, DeliveryState, PartitionLease, QueueMessage
from django_sqlqueue.models.delivery import MessageRef
from django_sqlqueue.operations.names import database_now_ms
from django_sqlqueue.partitioning import partition_names
from tests.admin_fixtures import client_for, staff
from tests.test_command_input import refused
from tests.test_operations import TOPIC, publish, register

pytestmark = pytest.mark.django_db

MESSAGES = reverse("admin:django_sqlqueue_queuemessage_changelist")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("sqlqueue", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def worker_group(group: str) -> None:
    """A consumer group as a worker registers it: watermarks and lease rows."""
    register(group)
    PartitionLease.objects.ensure_partitions(group, TOPIC, partition_names(12), "default")


def running(group: str, message: QueueMessage) -> None:
    """What a worker writes when it hands the message to a handler."""
    DeliveryState.objects.mark_delivered(group, TOPIC, [MessageRef(message.partition_key,
                                                                   message.offset)],
                                         database_now_ms("default") + 60_000, "default")


@pytest.fixture
def groups():
    worker_group("billing")
    worker_group("shipping")


def test_cancel_prints_each_groups_answer_and_exits_0(groups):
    [message] = publish(1)
    out = run("cancel", "--topic", TOPIC, "--id", message.id)
    assert out.strip() == (f"message {message.id!r} (offset {message.offset}) of {TOPIC!r}: "
                           "billing cancelled, shipping cancelled; groups registering later "
                           "skip it")
    assert set(Cancellation.objects.values_list("consumer_group", "cancelled_by")) == {
        ("", "manage.py sqlqueue"), ("billing", "manage.py sqlqueue"),
        ("shipping", "manage.py sqlqueue")}


def test_cancel_for_one_group_names_only_it(groups):
    [message] = publish(1)
    out = run("cancel", "--topic", TOPIC, "--id", message.id, "--group", "shipping")
    assert out.strip().endswith(": shipping cancelled")


def test_cancel_exits_1_with_one_line_when_a_group_has_started_it(groups):
    [message] = publish(1)
    running("billing", QueueMessage.objects.get(offset=message.offset))
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("sqlqueue", "cancel", "--topic", TOPIC, "--id", message.id, stdout=out)
    assert caught.value.returncode == 1
    assert "\n" not in str(caught.value)
    assert "billing running, shipping cancelled" in out.getvalue()


@pytest.mark.parametrize("args", [
    ("cancel", "--topic", "nothing", "--id", "x"),
    ("cancel", "--topic", TOPIC, "--id", "no-such-id"),
    ("cancel", "--topic", TOPIC, "--id", "dup"),  # under two keys
    ("cancel", "--topic", TOPIC, "--id", "dup", "--key", "k1", "--group", "nobody"),
    ("cancel", "--topic", TOPIC, "--id", "dup", "--key", "k1", "--group", "bad name"),
    ("cancel", "--topic", TOPIC, "--id", "x" * 200),
    ("cancel", "--topic", TOPIC),
])
def test_bad_input_is_one_line_and_exits_2(groups, args):
    sqlqueue.publish(TOPIC, {}, key="k1", id="dup")
    sqlqueue.publish(TOPIC, {}, key="k2", id="dup")
    refused("sqlqueue", *args)


def test_the_admin_action_cancels_the_selected_messages_and_records_it(groups):
    stored = publish(3)
    running("billing", QueueMessage.objects.get(offset=stored[2].offset))
    client = client_for(staff("ops", "view_queuemessage", "cancel_message"))
    response = client.post(MESSAGES, {"action": "cancel_messages",
                                      ACTION_CHECKBOX_NAME: [m.offset for m in stored]},
                           follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert any(f"Cancelled 2 message(s) for every consumer group: {stored[1].offset}, "
               f"{stored[0].offset}." == text for text in shown), shown
    assert any(f"Message {stored[2].offset} was not cancelled for every group (started or "
               "handled already: billing running)" in text for text in shown), shown
    assert Cancellation.objects.filter(consumer_group="", cancelled_by="admin:ops").count() == 3
    assert LogEntry.objects.filter(change_message__startswith="Cancelled 2 message(s)").exists()
    # The message page says who cancelled it, per group.
    page = client.get(reverse("admin:django_sqlqueue_queuemessage_change",
                              args=[stored[0].offset]))
    states = {d.group: d.state for d in page.context["sqlqueue_deliveries"]}
    assert states["billing"].startswith("cancelled by admin:ops at ")
    assert "Cancelled for every consumer group" in page.content.decode()


def test_the_cancel_action_is_offered_only_to_users_who_may_cancel(groups):
    [message] = publish(1)
    viewer = client_for(staff("viewer", "view_queuemessage"))
    page = viewer.get(MESSAGES)
    assert "cancel_messages" not in page.content.decode()
    viewer.post(MESSAGES, {"action": "cancel_messages", ACTION_CHECKBOX_NAME: [message.offset]})
    assert not Cancellation.objects.exists()
    may = client_for(staff("ops", "view_queuemessage", "cancel_message"))
    assert "cancel_messages" in may.get(MESSAGES).content.decode()
