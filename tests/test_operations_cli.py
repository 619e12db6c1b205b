"""``manage.py sqlqueue`` stats, health, replay, discard, pause, resume, deliver-now,
release-leases and gc: output, exit status, and one line for every bad input."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_sqlqueue.models import GroupControl, PartitionLease, QueueMessage, SubscriberHeartbeat
from tests.helpers import now_ms
from tests.test_command_input import one_error_line, refused
from tests.test_operations import TOPIC, ack_up_to, dead_letter, publish, register
from tests.worker_harness import run_manage

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("sqlqueue", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def failed():
    """billing and shipping registered for "orders"; billing dead-lettered three messages."""
    register("billing")
    register("shipping")
    stored = publish(3)
    return [dead_letter("billing", m, error=f"Boom {i}") for i, m in enumerate(stored)]


# --------------------------------------------------------------------------- stats


def test_stats_json_has_the_documented_fields_and_types(failed):
    out, _ = run("stats", "--json")
    rows = {row["group"]: row for row in json.loads(out)}
    assert set(rows) == {"billing", "shipping"}
    billing = rows["billing"]
    for name in ("lag", "in_flight", "dead_letters", "workers"):
        assert type(billing[name]) is int, name
    assert type(billing["paused"]) is bool
    assert billing["topic"] == TOPIC and billing["dead_letters"] == 3 and billing["lag"] == 3
    assert isinstance(billing["oldest_pending_age_seconds"], float)


def test_stats_json_gives_null_age_when_nothing_is_pending():
    register("billing")
    stored = publish(1)
    ack_up_to("billing", "k", stored[0].offset)
    out, _ = run("stats", "--json", "--group", "billing")
    [row] = json.loads(out)
    assert row["oldest_pending_age_seconds"] is None and row["lag"] == 0


def test_stats_json_prints_one_object_per_line(failed):
    out, _ = run("stats", "--json")

    lines = out.splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == 2 + 2
    assert [json.loads(line.rstrip(","))["group"] for line in lines[1:-1]] == ["billing", "shipping"]
    assert len(json.loads(out)[0]["handled_per_minute"]) == 60


def test_stats_json_indent_is_for_humans(failed):
    out, _ = run("stats", "--json", "--indent", "2")

    assert len(out.splitlines()) > 100 and json.loads(out)[0]["group"] == "billing"
    assert '\n  {\n    "topic": "orders",' in out


def test_stats_json_with_nothing_registered_is_an_empty_list():
    assert run("stats", "--json")[0].strip() == "[]"


@pytest.mark.parametrize("args", [
    ("stats", "--json", "--indent", "x"), ("stats", "--json", "--indent", "-1"),
    ("stats", "--json", "--indent", "17"), ("stats", "--indent", "2"),
])
def test_stats_refuses_a_bad_indent_in_one_line(failed, args):
    refused("sqlqueue", *args)


def test_stats_prints_a_table(failed):
    out, _ = run("stats")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TOPIC", "GROUP", "LAG"]
    assert any(line.split()[:3] == [TOPIC, "billing", "3"] for line in lines)


# --------------------------------------------------------------------------- health


def test_health_exits_1_with_one_line_without_a_live_worker(failed):
    with pytest.raises(CommandError) as caught:
        run("health")
    assert caught.value.returncode == 1 and "no live worker" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_health_exits_0_when_each_group_has_a_live_worker(failed):
    for group in ("billing", "shipping"):
        SubscriberHeartbeat.objects.create(consumer_group=group, topic=TOPIC,
                                           subscriber_name=f"{group}-1", heartbeat_at=now_ms())
    out, _ = run("health", "--max-age", "1h")
    assert out.startswith("ok:")


def test_health_reports_every_failing_condition_of_a_group(failed):
    with pytest.raises(CommandError) as caught:
        run("health", "--group", "billing", "--max-age", "0")

    line = str(caught.value)
    assert caught.value.returncode == 1 and "\n" not in line
    assert "billing/orders: no live worker, oldest pending message due" in line
    assert "(max 0s)" in line


def test_health_reports_every_failing_group(failed):
    with pytest.raises(CommandError) as caught:
        run("health")

    assert "billing/orders: no live worker" in str(caught.value)
    assert "shipping/orders: no live worker" in str(caught.value)


@pytest.mark.django_db(transaction=True)  # committed, so the command's process sees it
def test_health_on_the_command_line_exits_1():
    register("billing")
    result = run_manage("sqlqueue", "health", "--group", "billing")
    assert result.returncode == 1, result
    assert len(result.stderr.strip().splitlines()) == 1 and "billing" in result.stderr


# --------------------------------------------------------------------------- replay / discard


def test_replay_dry_run_prints_count_and_sample_and_changes_nothing(failed):
    out, _ = run("replay", "--topic", TOPIC, "--dry-run")
    assert out.splitlines()[0] == "3 dead letter(s) match; dry run, nothing replayed"
    assert sum(f"id={d.offset}" in out for d in failed) == 3
    assert QueueMessage.objects.filter(topic=TOPIC + "_dlq").count() == 3


def test_replay_by_id_replays_only_those(failed):
    out, _ = run("replay", "--id", str(failed[0].offset), "--id", str(failed[2].offset))
    assert out.strip() == "replayed 2 of 2 dead letter(s)"
    assert list(QueueMessage.objects.filter(topic=TOPIC + "_dlq")
                .values_list("offset", flat=True)) == [failed[1].offset]


def test_discard_by_error_and_group(failed):
    out, _ = run("discard", "--group", "billing", "--error-contains", "boom 1")
    assert out.strip() == "discarded 1 of 1 dead letter(s)"
    assert QueueMessage.objects.filter(topic=TOPIC + "_dlq").count() == 2


def test_a_large_selection_shows_a_progress_bar(failed, monkeypatch):
    monkeypatch.setattr("django_sqlqueue.management.progress.MIN_TOTAL", 2)
    _, err = run("discard", "--topic", TOPIC, "--batch-size", "1")
    assert "discarded [" in err and "3/3" in err
    assert len(err.splitlines()) <= 11  # a line per tenth when not a terminal


@pytest.mark.parametrize("args", [
    ("replay", "--id", "abc"), ("replay", "--id", "0"), ("replay", "--id", "-5"),
    ("replay", "--older-than", "soon"), ("replay", "--older-than", "-1"),
    ("replay", "--older-than", "1e999"), ("discard", "--batch-size", "0"),
    ("discard", "--topic", "no such topic"), ("discard", "--topic", "nosuchtopic"),
    ("replay", "--group", "nosuchgroup"), ("replay", "--error-contains", ""),
    ("replay", "--error-contains", "a\nb"),
])
def test_bad_dead_letter_filters_are_one_line_and_exit_2(failed, args):
    refused("sqlqueue", *args)


@pytest.mark.django_db(transaction=True)  # no open transaction holding SQLite's lock
def test_a_bad_filter_on_the_command_line_is_one_line():
    line = one_error_line(run_manage("sqlqueue", "replay", "--older-than", "yesterday"))
    assert "--older-than" in line


@pytest.mark.parametrize("command", ["replay", "discard"])
def test_a_dead_letter_topic_for_topic_is_refused_naming_the_original(failed, command):
    error = refused("sqlqueue", command, "--topic", f"{TOPIC}_dlq")

    assert str(error) == (f"--topic is the topic the messages were published to, not their "
                          f"dead-letter topic: use --topic {TOPIC} (not {TOPIC}_dlq)")
    assert QueueMessage.objects.filter(topic=f"{TOPIC}_dlq").count() == 3


def test_a_dead_letter_topic_is_accepted_when_its_own_messages_were_dead_lettered(failed):
    # A group consuming orders_dlq itself gave up on one: it sits in orders_dlq_dlq.
    register("auditors", topic=f"{TOPIC}_dlq")
    [stored] = publish(1, topic=f"{TOPIC}_dlq")
    dead_letter("auditors", stored, topic=f"{TOPIC}_dlq")

    out, _ = run("replay", "--topic", f"{TOPIC}_dlq", "--dry-run")

    assert out.splitlines()[0] == "1 dead letter(s) match; dry run, nothing replayed"


# --------------------------------------------------------------------------- control


def test_pause_and_resume(failed):
    assert "paused" in run("pause", "--topic", TOPIC, "--group", "billing")[0]
    assert GroupControl.objects.get(consumer_group="billing").paused
    assert "was paused already" in run("pause", "--topic", TOPIC, "--group", "billing")[0]
    assert "resumed" in run("resume", "--topic", TOPIC, "--group", "billing")[0]
    assert not GroupControl.objects.get(consumer_group="billing").paused


@pytest.mark.parametrize("args", [
    ("pause", "--topic", TOPIC, "--group", "nobody"),
    ("resume", "--topic", "nothing", "--group", "billing"),
    ("pause", "--topic", TOPIC, "--group", "bad name"),
    ("release-leases", "--subscriber", "nobody"),
    ("release-leases", "--subscriber", "w1", "--partition", "x"),
    ("release-leases", "--subscriber", "w1", "--group", "billing"),
    ("deliver-now", "--topic", TOPIC, "--group", "billing", "--offset", "x"),
    ("deliver-now", "--topic", TOPIC, "--group", "billing", "--offset", "999999"),
    ("health", "--max-age", "old"), ("health", "--group", "nobody"),
    ("gc", "--topic", "nothing"), ("stats", "--group", "nobody"),
])
def test_unknown_names_and_bad_values_are_one_line_and_exit_2(failed, args):
    refused("sqlqueue", *args)


def test_release_leases_prints_what_it_freed(failed):
    PartitionLease.objects.ensure_partitions("billing", TOPIC, ["0", "1"], "default")
    PartitionLease.objects.update(leased_by="w1", lease_token="t")
    out, _ = run("release-leases", "--subscriber", "w1", "--group", "billing", "--topic", TOPIC,
                 "--partition", "1")
    assert out.strip() == "released 1 lease(s) of 'w1'"
    out, _ = run("release-leases", "--subscriber", "w1")
    assert out.strip() == "released 1 lease(s) of 'w1'"
    assert not PartitionLease.objects.exclude(leased_by="").exists()


def test_gc_prints_what_it_deleted():
    register("billing")
    stored = publish(3)
    ack_up_to("billing", "k", stored[1].offset)
    out, _ = run("gc")
    assert out.strip() == f"gc deleted 2 message(s) of {TOPIC!r}"
    assert run("gc")[0].strip() == "gc deleted nothing"
