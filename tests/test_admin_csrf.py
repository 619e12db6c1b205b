"""CSRF protection of every admin view of the app, under a client that enforces it (Django's
test client skips the check by default).

The views are read from the admin's URL conf: a new view, or a new admin action, is
checked without touching this file, and the test fails until its token-carrying POST is
described in STATE_CHANGES (or it is listed as changing nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import URLPattern, reverse

from django_sqlqueue import schedules
from django_sqlqueue.admin.actions import CONFIRM_FIELD
from django_sqlqueue.models import (
    Cancellation,
    ConsumerOffset,
    DeadLetter,
    DeliveryState,
    GroupControl,
    LogSequencer,
    PartitionLease,
    QueueMessage,
    Schedule,
    SubscriberHeartbeat,
)
from django_sqlqueue.sequencing import sequence_all
from tests.admin_fixtures import dead_letter

pytestmark = pytest.mark.django_db

APP = "django_sqlqueue"


def db_now() -> int:
    return LogSequencer.objects.head("default")[2]


class Rows:
    """One of each row the state-changing views act on."""

    def __init__(self) -> None:
        ConsumerOffset.objects.ensure("billing", "orders", [str(p) for p in range(12)], "default")
        ConsumerOffset.objects.ensure("retired", "orders", ["0"], "default")
        ConsumerOffset.objects.ensure("retired", "invoices", ["0"], "default")
        SubscriberHeartbeat.objects.create(consumer_group="retired", topic="orders",
                                           subscriber_name="w-killed",
                                           heartbeat_at=db_now() - 600_000)
        PartitionLease.objects.ensure_partitions("billing", "orders", ["3"], "default")
        PartitionLease.objects.filter(partition_key="3").update(leased_by="w-1", lease_token="t")
        self.replayed = dead_letter(group="billing")
        self.discarded = dead_letter(group="billing", payload={"n": 2})
        stored = QueueMessage.objects.filter(topic="orders", failed_at=0).order_by("offset").first()
        sequence_all()
        self.waiting = QueueMessage.objects.get(offset=stored.offset)
        DeliveryState.objects.create(consumer_group="billing", topic="orders",
                                     partition_key=self.waiting.partition_key,
                                     message_offset=self.waiting.offset, retry_count=1,
                                     invisible_until=db_now() + 3_600_000, last_error="boom")
        schedules.add("nightly-report", cron="0 3 * * *", topic="orders", payload={})


# url name -> [(POST data, what it changed)], for views that change state on POST.
Change = tuple[Callable[[Rows], dict[str, Any]], Callable[[Rows], bool]]
STATE_CHANGES: dict[str, list[Change]] = {
    "django_sqlqueue_overview": [
        (lambda rows: {"action": "pause", "group": "billing", "topic": "orders"},
         lambda rows: GroupControl.objects.get(consumer_group="billing").paused),
        (lambda rows: {"action": "resume", "group": "billing", "topic": "orders"},
         lambda rows: not GroupControl.objects.get(consumer_group="billing").paused),
    ],
    "django_sqlqueue_partition_changelist": [
        (lambda rows: {"action": "release", "group": "billing", "topic": "orders",
                       "partition": "3"},
         lambda rows: PartitionLease.objects.get(partition_key="3").leased_by == ""),
    ],
    "django_sqlqueue_subscriber_changelist": [
        (lambda rows: {"action": "forget", "group": "retired", "topic": "orders"},
         lambda rows: not ConsumerOffset.objects.filter(consumer_group="retired",
                                                        topic="orders").exists()),
        (lambda rows: {"action": "forget", "group": "retired", "all_topics": "1"},
         lambda rows: not ConsumerOffset.objects.filter(consumer_group="retired").exists()),
    ],
    "django_sqlqueue_queuemessage_deliver": [
        (lambda rows: {"group": "billing"},
         lambda rows: DeliveryState.objects.get(message_offset=rows.waiting.offset)
         .invisible_until <= db_now()),
    ],
}
# Admin actions (the changelist's "action" select), by changelist url name and action name.
ACTIONS: dict[tuple[str, str], Change] = {
    ("django_sqlqueue_deadletter_changelist", "replay_dead_letters"): (
        lambda rows: {"_selected_action": [str(rows.replayed.offset)]},
        lambda rows: not DeadLetter.objects.filter(offset=rows.replayed.offset).exists()),
    ("django_sqlqueue_deadletter_changelist", "discard_dead_letters"): (
        lambda rows: {"_selected_action": [str(rows.discarded.offset)]},
        lambda rows: not DeadLetter.objects.filter(offset=rows.discarded.offset).exists()),
    ("django_sqlqueue_schedule_changelist", "pause_schedules"): (
        lambda rows: {"_selected_action": ["nightly-report"]},
        lambda rows: Schedule.objects.get(name="nightly-report").paused),
    ("django_sqlqueue_schedule_changelist", "resume_schedules"): (
        lambda rows: {"_selected_action": ["nightly-report"]},
        lambda rows: not Schedule.objects.get(name="nightly-report").paused),
    ("django_sqlqueue_queuemessage_changelist", "cancel_messages"): (
        lambda rows: {"_selected_action": [str(rows.waiting.offset)]},
        lambda rows: Cancellation.objects.filter(message_offset=rows.waiting.offset).exists()),
}
# Views whose POST changes nothing: the read-only object pages (add, change and delete are
# refused; history only shows), the overview's second name (the same view as
# django_sqlqueue_overview), and changelists whose POSTs are their admin actions.
NO_STATE_CHANGE = {
    f"{APP}_{model}_{view}" for model in ("deadletter", "queuemessage", "schedule")
    for view in ("add", "change", "delete", "history")
} | {None, "django_sqlqueue_overview_changelist", "django_sqlqueue_deadletter_changelist",
     "django_sqlqueue_queuemessage_changelist", "django_sqlqueue_schedule_changelist"}


def app_admin_urls(rows: Rows) -> list[tuple[str | None, str, Any]]:
    """(url name, URL, ModelAdmin) for every URL pattern of the app's ModelAdmins."""
    found = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label != APP:
            continue
        prefix = reverse(f"admin:{APP}_{model._meta.model_name}_changelist") \
            if model._meta.model_name != "overview" else reverse(f"admin:{APP}_overview")
        for pattern in model_admin.get_urls():
            assert isinstance(pattern, URLPattern), pattern
            route = str(pattern.pattern)
            for name in ("<path:object_id>", "<int:offset>"):
                offset = rows.waiting.offset if model is QueueMessage else rows.replayed.offset
                route = route.replace(name, str(offset))
            assert "<" not in route, f"fill in the URL parameters of {pattern.pattern}"
            found.append((pattern.name, prefix + route, model_admin))
    return found


@pytest.fixture
def rows() -> Rows:
    return Rows()


@pytest.fixture
def csrf_client(admin_user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    return client


def token(client: Client) -> str:
    client.get(reverse("admin:index"))  # sets the csrftoken cookie
    return client.cookies["csrftoken"].value


def refused_for_csrf(response) -> bool:
    return response.status_code == 403 and b"CSRF verification failed" in response.content


def test_every_post_to_an_admin_view_of_the_app_without_a_token_is_refused(csrf_client, rows):
    urls = app_admin_urls(rows)
    assert len(urls) >= 15
    posts = [(url, data(rows)) for name, url, _ in urls for data, _ in STATE_CHANGES.get(name, [])]
    posts += [(url, {}) for _, url, _ in urls]
    posts += [(reverse(f"admin:{changelist}"), {"action": action, CONFIRM_FIELD: "yes",
                                                **data(rows)})
              for (changelist, action), (data, _) in ACTIONS.items()]
    before = (LogEntry.objects.count(), DeadLetter.objects.count(),
              list(GroupControl.objects.values_list("paused", flat=True)),
              list(ConsumerOffset.objects.order_by("consumer_group", "topic", "partition_key")
                   .values_list("consumer_group", "topic", "partition_key")),
              list(PartitionLease.objects.values_list("leased_by", flat=True)),
              list(Schedule.objects.values_list("paused", flat=True)), Cancellation.objects.count())

    for url, data in posts:
        response = csrf_client.post(url, data)
        assert refused_for_csrf(response), (url, data, response.status_code)

    after = (LogEntry.objects.count(), DeadLetter.objects.count(),
             list(GroupControl.objects.values_list("paused", flat=True)),
             list(ConsumerOffset.objects.order_by("consumer_group", "topic", "partition_key")
                  .values_list("consumer_group", "topic", "partition_key")),
             list(PartitionLease.objects.values_list("leased_by", flat=True)),
             list(Schedule.objects.values_list("paused", flat=True)), Cancellation.objects.count())
    assert after == before


def test_every_state_changing_admin_view_of_the_app_acts_on_a_post_with_a_token(csrf_client,
                                                                               rows):
    secret = token(csrf_client)
    for name, url, _ in app_admin_urls(rows):
        assert name in STATE_CHANGES or name in NO_STATE_CHANGE, (
            f"admin view {name!r} ({url}) is new: describe its POST in STATE_CHANGES, or add "
            "it to NO_STATE_CHANGE if a POST to it changes nothing")
        for data, changed in STATE_CHANGES.get(name, []):
            response = csrf_client.post(url, {**data(rows), "csrfmiddlewaretoken": secret})
            assert not refused_for_csrf(response), (name, url)
            assert response.status_code in (200, 302), (name, response.status_code)
            assert changed(rows), (name, data(rows))
        if name not in STATE_CHANGES:  # a token gets past CSRF; what happens then is the view's
            response = csrf_client.post(url, {"csrfmiddlewaretoken": secret})
            assert not refused_for_csrf(response), (name, url)


def test_every_admin_action_of_the_app_runs_on_a_post_with_a_token(csrf_client, admin_user, rows):
    secret = token(csrf_client)
    request = csrf_client.get(reverse("admin:index")).wsgi_request
    request.user = admin_user
    offered = set()
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label == APP:
            changelist = f"{APP}_{model._meta.model_name}_changelist"
            offered |= {(changelist, action) for action in model_admin.get_actions(request)}
    assert offered == set(ACTIONS), "describe each new admin action's POST in ACTIONS"
    for (changelist, action), (data, changed) in ACTIONS.items():
        response = csrf_client.post(reverse(f"admin:{changelist}"), {
            "action": action, CONFIRM_FIELD: "yes", "csrfmiddlewaretoken": secret, **data(rows)})
        assert not refused_for_csrf(response), action
        assert response.status_code == 302, (action, response.status_code)
        assert changed(rows), action
