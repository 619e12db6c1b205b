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
from django_sqlqueue.admin.actions import CONFIRM_FIELD
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
    selection = {"action": "cancel_messages", ACTION_CHECKBOX_NAME: [m.offset for m in stored]}
    assert client.post(MESSAGES, selection).status_code == 200  # the confirmation page
    response = client.post(MESSAGES, {**selection, CONFIRM_FIELD: "yes"}, follow=True)
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


def cancel_post(client, select_across: bool = False, **fields):
    return client.post(MESSAGES, {"action": "cancel_messages", "index": "0",
                                  "select_across": "1" if select_across else "0", **fields})


def test_the_admin_cancel_shows_how_many_in_which_topics_and_groups_first(groups):
    orders = publish(3)
    invoices = publish(2, topic="invoices")
    client = client_for(staff("ops", "view_queuemessage", "cancel_message"))
    page = cancel_post(client, **{ACTION_CHECKBOX_NAME: [m.offset for m in orders + invoices]})
    assert page.status_code == 200
    assert not Cancellation.objects.exists()  # nothing happens before the confirmation
    text = page.content.decode()
    assert "Cancel <strong>5</strong> messages?" in text
    assert ("3 in topic &#x27;orders&#x27;, for consumer group(s) billing, shipping and any "
            "group registered later") in text
    assert "2 in topic &#x27;invoices&#x27;, for any consumer group registered later (none yet)" in text
    done = cancel_post(client, **{ACTION_CHECKBOX_NAME: [m.offset for m in orders + invoices],
                                  CONFIRM_FIELD: "yes"})
    assert done.status_code == 302
    assert set(Cancellation.objects.filter(consumer_group="")
               .values_list("message_offset", flat=True)) == {m.offset for m in orders + invoices}


def test_cancelling_everything_the_filter_matches_shows_the_real_scope_and_cancels_only_that(
        groups, monkeypatch):
    from django_sqlqueue.admin import messages as module
    monkeypatch.setattr(module, "MAX_CANCEL", 4)
    orders = publish(6)
    publish(2, topic="invoices")
    client = client_for(staff("ops", "view_queuemessage", "cancel_message"))
    # "Select all", as a browser posts it (with the rows of the page ticked), filtered.
    page = client.post(MESSAGES + "?topic=orders", {
        "action": "cancel_messages", "index": "0", "select_across": "1",
        ACTION_CHECKBOX_NAME: [orders[-1].offset]})
    assert page.status_code == 200 and not Cancellation.objects.exists()
    text = page.content.decode()
    assert "Cancel <strong>4</strong> messages (everything the current filter matches)?" in text
    assert "More than 4 messages match: only the newest 4" in text
    assert "4 in topic &#x27;orders&#x27;" in text and "invoices" not in text
    shown = page.context["hidden"]
    # Published after the page was shown: not what the operator confirmed.
    later = publish(1)
    confirmed = {"action": "cancel_messages", "index": "0", "select_across": "1",
                 ACTION_CHECKBOX_NAME: [orders[-1].offset], CONFIRM_FIELD: "yes", **dict(shown)}
    assert client.post(MESSAGES + "?topic=orders", confirmed).status_code == 302
    assert set(Cancellation.objects.values_list("message_offset", flat=True)) == {
        m.offset for m in orders[2:]}
    assert not Cancellation.objects.filter(message_offset=later[0].offset).exists()


def test_select_all_without_its_confirmation_page_cancels_nothing(groups):
    [message] = publish(1)
    client = client_for(staff("ops", "view_queuemessage", "cancel_message"))
    page = cancel_post(client, select_across=True, **{ACTION_CHECKBOX_NAME: [message.offset],
                                                      CONFIRM_FIELD: "yes"})
    assert page.status_code == 200 and 'id="sqlqueue-confirm-count"' in page.content.decode()
    assert not Cancellation.objects.exists()
