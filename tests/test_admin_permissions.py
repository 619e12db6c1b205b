"""Who may act in the admin: each operation needs its own permission and the view permission
of the page it acts from. A permission to act is never a permission to act blind.

The views and actions are those the CSRF tests enumerate from the admin's URL conf and
registry (tests/test_admin_csrf.py), so a new one is covered here as soon as it is there.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from django_sqlqueue.admin.actions import CONFIRM_FIELD
from django_sqlqueue.models import (
    Cancellation,
    ConsumerOffset,
    DeadLetter,
    DeliveryState,
    GroupControl,
    PartitionLease,
    Schedule,
)
from tests.admin_fixtures import client_for, staff
from tests.test_admin_csrf import ACTIONS, APP, STATE_CHANGES, Rows, app_admin_urls

pytestmark = pytest.mark.django_db

VIEW_ALL = ("view_deadletter", "view_queuemessage", "view_overview", "view_partition",
            "view_subscriber", "view_schedule")


def operating_permissions() -> list[str]:
    """Every permission of the app that is not a view permission."""
    return list(Permission.objects.filter(content_type__app_label=APP)
                .exclude(codename__startswith="view_").values_list("codename", flat=True))


def state() -> tuple[Any, ...]:
    return (Cancellation.objects.count(), DeadLetter.objects.count(),
            list(GroupControl.objects.values_list("paused", flat=True)),
            list(Schedule.objects.values_list("paused", flat=True)),
            list(ConsumerOffset.objects.order_by("consumer_group", "topic", "partition_key")
                 .values_list("consumer_group", "topic", "partition_key")),
            list(PartitionLease.objects.order_by("partition_key")
                 .values_list("leased_by", flat=True)),
            list(DeliveryState.objects.values_list("invisible_until", flat=True)))


def operations(rows: Rows) -> list[tuple[str, str, dict[str, Any], str, Any]]:
    """(what, URL, POST data, the view permission of its page, whether it acted) for every
    operation of the admin, in the CSRF tests' order (pause before resume, ...)."""
    found = []
    for name, url, model_admin in app_admin_urls(rows):
        for data, changed in STATE_CHANGES.get(name, []):
            found.append((name, url, data(rows), f"view_{model_admin.opts.model_name}",
                          changed))
    for (changelist, action), (data, changed) in ACTIONS.items():
        model = changelist.removeprefix(f"{APP}_").removesuffix("_changelist")
        found.append((action, reverse(f"admin:{changelist}"),
                      {"action": action, "index": "0", CONFIRM_FIELD: "yes", **data(rows)},
                      f"view_{model}", changed))
    return found


def test_each_operation_needs_its_permission_and_the_view_permission_of_its_page():
    rows = Rows()
    viewer = client_for(staff("viewer", *VIEW_ALL))
    blind = client_for(staff("blind", *operating_permissions()))
    matrix = operations(rows)
    assert len(matrix) >= 11
    for n, (what, url, data, view, changed) in enumerate(matrix):
        before = state()
        assert viewer.post(url, data).status_code in (403, 302, 200), what
        assert state() == before, f"{what}: done by a user who may only look"
        assert blind.post(url, data).status_code == 403, what
        assert state() == before, f"{what}: done by a user without {view}"
        operator: Client = client_for(staff(f"operator{n}", view, *operating_permissions()))
        assert operator.post(url, data).status_code in (302, 200), what
        assert changed(rows), f"{what}: refused to a user with {view} and its permission"


def test_deliver_now_needs_the_view_permission_of_the_message():
    rows = Rows()
    url = reverse("admin:django_sqlqueue_queuemessage_deliver", args=[rows.waiting.offset])
    deliverer = client_for(staff("deliverer", "deliver_message"))
    assert deliverer.post(url, {"group": "billing"}).status_code == 403
    delivery = DeliveryState.objects.get(message_offset=rows.waiting.offset)
    assert delivery.invisible_until > rows.waiting.published_at + 3_000_000


def test_changing_a_schedule_is_not_a_way_of_looking_at_them():
    Rows()
    pauser = client_for(staff("pauser", "change_schedule"))
    url = reverse("admin:django_sqlqueue_schedule_changelist")
    assert pauser.get(url).status_code == 403
    assert pauser.post(url, {"action": "pause_schedules", "index": "0",
                             "_selected_action": ["nightly-report"]}).status_code == 403
    assert not Schedule.objects.get(name="nightly-report").paused
