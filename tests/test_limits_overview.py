"""What operators see of the limits: the overview page, ``operations.limits_overview`` and
the metrics show each scope's running slots against its max_running, and its bucket."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_sqlqueue import operations
from django_sqlqueue.metrics.database import DatabaseCollector
from django_sqlqueue.models import LimitBucket, LimitSlot
from django_sqlqueue.models.limit_buckets import Bucket
from django_sqlqueue.operations.names import database_now_ms
from tests.admin_fixtures import client_for, staff

pytestmark = pytest.mark.django_db

SCOPE = "limits:capped"


def hold_slots(scope: str, key: str, count: int, held: int) -> None:
    now = database_now_ms("default")
    LimitSlot.objects.ensure(scope, key, count, now, "default")
    for row_id, _ in LimitSlot.objects.lock_free(scope, key, count, held, now, "default"):
        LimitSlot.objects.take(row_id, "worker-token", "capped/0@1", now + 60_000, now, "default")


def test_the_overview_counts_running_slots_against_max_running():
    hold_slots(SCOPE, "", 3, 2)

    row = next(r for r in operations.limits_overview() if r.scope == SCOPE)

    assert (row.running, row.max_running, row.fullness) == (2, 3, pytest.approx(2 / 3))


def test_expired_slots_do_not_count_as_running():
    now = database_now_ms("default")
    LimitSlot.objects.ensure(SCOPE, "", 3, now, "default")
    row_id, _ = LimitSlot.objects.lock_free(SCOPE, "", 3, 1, now, "default")[0]
    LimitSlot.objects.take(row_id, "dead-worker", "capped/0@1", now - 1, now, "default")

    row = next(r for r in operations.limits_overview() if r.scope == SCOPE)

    assert row.running == 0


def test_per_key_slots_and_a_rate_bucket_are_shown():
    hold_slots("limits:capped-keys", "a", 2, 2)
    hold_slots("limits:capped-keys", "b", 2, 1)
    now = database_now_ms("default")
    bucket = LimitBucket.objects.lock("limits:paced", "", "20/s", 20, 0.02, now, "default")
    assert isinstance(bucket, Bucket)
    bucket.tokens -= 5
    LimitBucket.objects.save_tokens(bucket, 20, 0.02, now, "default")

    rows = {r.scope: r for r in operations.limits_overview()}

    assert (rows["limits:capped-keys"].keys_running,
            rows["limits:capped-keys"].key_slots_running) == (2, 3)
    assert rows["limits:capped-keys"].max_running_per_key == 2
    assert rows["limits:paced"].rate == "20/s"
    assert 15 <= rows["limits:paced"].tokens <= 20


def test_the_admin_overview_lists_the_limits():
    hold_slots(SCOPE, "", 3, 3)
    client = client_for(staff("ops", "view_overview"))

    page = client.get(reverse("admin:django_sqlqueue_overview")).content.decode()

    assert 'id="sqlqueue-limits"' in page
    assert f'data-scope="{SCOPE}"' in page
    assert "3 / 3" in page


def test_the_metrics_export_each_limit():
    hold_slots(SCOPE, "", 3, 1)

    families = {f.name: f for f in DatabaseCollector().collect()}

    def value(name: str) -> float:
        return next(s.value for s in families[name].samples if s.labels == {"scope": SCOPE})

    assert value("sqlqueue_limit_running") == 1
    assert value("sqlqueue_limit_max_running") == 3


def test_the_limits_command_prints_each_limit(capsys):
    hold_slots(SCOPE, "", 3, 2)
    hold_slots("limits:capped-keys", "a", 2, 1)

    call_command("sqlqueue", "limits")
    lines = capsys.readouterr().out.splitlines()

    assert lines[0].split() == ["SCOPE", "RUNNING", "RATE", "TOKENS", "PER", "KEY", "KEYS",
                                "RUNNING"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows[SCOPE].split()[1] == "2/3"
    assert "2 running" in rows["limits:capped-keys"]
    assert "1 (1 slots)" in rows["limits:capped-keys"]

    call_command("sqlqueue", "limits", "--json")
    objects = {o["scope"]: o for o in json.loads(capsys.readouterr().out)}
    assert (objects[SCOPE]["running"], objects[SCOPE]["max_running"]) == (2, 3)


def test_the_limits_command_says_when_no_limit_was_used(capsys):
    call_command("sqlqueue", "limits")
    assert capsys.readouterr().out.strip() == "no limit has been used yet"
    call_command("sqlqueue", "limits", "--json")
    assert json.loads(capsys.readouterr().out) == []
