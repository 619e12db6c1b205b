"""The queue on a database of its own: ``SQLQUEUE["DATABASE"] = "queue"`` with
``django_sqlqueue.routers.QueueRouter``, the project's own tables on ``default``.

The ``queue`` alias is a second database on the suite's server (a second file on SQLite),
added for this module only, so the rest of the suite keeps its one database. In-process
tests switch to the two-database settings with ``override_settings``; the worker and the
migrate check run in processes of their own under tests/settings_queue_database.py. The
default test database holds queue tables too (the rest of the suite uses them): each test
shows its rows land on ``queue`` and none on ``default``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections, transaction
from django.test import Client, override_settings
from django.urls import reverse

import django_sqlqueue as sqlqueue
from django_sqlqueue import schedules
from django_sqlqueue.checks import check_queue_database
from django_sqlqueue.conf import queue_database
from django_sqlqueue.metrics.database import DatabaseCollector
from django_sqlqueue.models import ConsumerOffset, QueueMessage, Schedule
from django_sqlqueue.testing import drain
from tests.second_database import ALIAS, NAME_VARIABLE, second_database, second_name
from tests.testapp.models import Handled
from tests.worker_harness import DEFAULT_TIMEOUT, REPO_ROOT, run_command

BOTH = ["default", ALIAS]
ROUTER = "django_sqlqueue.routers.QueueRouter"
ENGINE = settings.DATABASES["default"]["ENGINE"]


@pytest.fixture(scope="module", autouse=True)
def queue_alias(django_db_setup: Any, django_db_blocker: Any):
    """The ``queue`` alias, its test database created (and migrated) beside the default
    one for this module, and dropped after it."""
    default = connections["default"].settings_dict
    name = second_name(str(default["NAME"]), ENGINE)
    config = second_database(default, name)
    settings.DATABASES[ALIAS] = connections.configure_settings(
        {"default": settings.DATABASES["default"], ALIAS: config})[ALIAS]
    with django_db_blocker.unblock():
        # Django 6 no longer serializes a new test database; 5.2 does unless told not to.
        unserialized = {} if django.VERSION >= (6, 0) else {"serialize": False}
        connections[ALIAS].creation.create_test_db(verbosity=0, autoclobber=True,
                                                   **unserialized)
    try:
        yield name
    finally:
        with django_db_blocker.unblock():
            connections[ALIAS].creation.destroy_test_db(name, verbosity=0)
        connections[ALIAS].close()
        del connections[ALIAS]
        del settings.DATABASES[ALIAS]


def queue_settings(**changes: Any) -> override_settings:
    """These tests' settings with the queue on the ``queue`` alias (and ``changes``)."""
    values: dict[str, Any] = {"DATABASE_ROUTERS": [ROUTER],
                              "SQLQUEUE": {**settings.SQLQUEUE, "DATABASE": "queue"}}
    return override_settings(**{**values, **changes})


@pytest.fixture
def on_queue_database():
    with queue_settings():
        yield


def rows(alias: str, **filters: Any) -> int:
    return QueueMessage.objects.using(alias).filter(**filters).count()


# --------------------------------------------------------------------------- checks


def test_queue_database_names_the_configured_alias():
    assert queue_database() == "default"
    with queue_settings():
        assert queue_database() == "queue"


def test_the_router_sends_only_the_apps_models_to_the_queue_database():
    from django.db import router

    with queue_settings():
        assert router.db_for_write(QueueMessage) == "queue"
        assert router.db_for_read(Schedule) == "queue"
        assert router.db_for_write(Handled) == "default"
        assert router.allow_migrate("queue", "django_sqlqueue") is True
        assert router.allow_migrate("default", "django_sqlqueue") is False
        assert router.allow_migrate("default", "testapp") is True


def test_a_queue_database_without_the_router_is_e016():
    with queue_settings(DATABASE_ROUTERS=[]):
        errors = check_queue_database()
    assert [e.id for e in errors] == ["sqlqueue.E016"]
    assert "db_for_write answers 'default'" in errors[0].msg
    assert ROUTER in errors[0].hint
    with queue_settings():
        assert check_queue_database() == []


def test_a_queue_database_that_is_not_an_alias_is_e017():
    with queue_settings(SQLQUEUE={**settings.SQLQUEUE, "DATABASE": "queues"}):
        errors = check_queue_database()
    assert [e.id for e in errors] == ["sqlqueue.E017"]
    assert "'queues'" in errors[0].msg and "'queue'" in errors[0].msg


# --------------------------------------------------------------------------- tables


@pytest.fixture
def fresh_databases(django_db_setup: Any, django_db_blocker: Any, tmp_path: Path):
    """Names of two empty databases (files on SQLite) for default and queue, dropped after."""
    base = str(connections["default"].settings_dict["NAME"])
    if ENGINE == "django.db.backends.sqlite3":
        yield str(tmp_path / "default.sqlite3"), str(tmp_path / "queue.sqlite3")
        return
    names = [f"{Path(base).name}_fresh", f"{Path(base).name}_fresh_queue"]
    quote = connections["default"].ops.quote_name
    with django_db_blocker.unblock(), connections["default"].cursor() as cursor:
        for name in names:
            cursor.execute(f"DROP DATABASE IF EXISTS {quote(name)}")
            cursor.execute(f"CREATE DATABASE {quote(name)}")
    try:
        yield names[0], names[1]
    finally:
        with django_db_blocker.unblock(), connections["default"].cursor() as cursor:
            for name in names:
                cursor.execute(f"DROP DATABASE IF EXISTS {quote(name)}")


def test_migrate_creates_the_queue_tables_only_on_the_queue_database(fresh_databases):
    default_name, queue_name = fresh_databases
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SQLQUEUE_TEST_DB_NAME": default_name,
           NAME_VARIABLE: queue_name}
    env.pop("SQLQUEUE_TEST_SETTINGS", None)
    run = subprocess.run([sys.executable, "-m", "tests.queue_database_probe"], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    tables = json.loads(run.stdout)
    assert [t for t in tables["default"] if t.startswith("queue_")] == []
    assert "testapp_handled" in tables["default"]
    assert {"queue_messages", "queue_offsets", "queue_partition_leases", "queue_schedules",
            "queue_task_results"} <= set(tables["queue"])


# --------------------------------------------------------------------------- publishing


@pytest.mark.django_db(databases=BOTH, transaction=True)
def test_publish_in_a_transaction_on_default_commits_with_the_queue_database(on_queue_database):
    # The message is written on the queue's connection, which is not in the block: it
    # commits there at once, and the domain write's rollback does not take it back.
    with pytest.raises(RuntimeError), transaction.atomic():
        Handled.objects.create(group="g", topic="t", key="", offset=1, message_id="m",
                               attempt=1, pid=0, handled_at=0)
        sqlqueue.publish("orders", {"n": 1}, id="kept")
        raise RuntimeError("the domain write fails")
    assert Handled.objects.count() == 0
    assert rows("queue", message_id="kept") == 1
    assert rows("default") == 0


@pytest.mark.django_db(databases=BOTH, transaction=True)
def test_publish_in_blocks_on_both_databases_commits_and_rolls_back_with_them(on_queue_database):
    with transaction.atomic(using="default"), transaction.atomic(using="queue"):
        Handled.objects.create(group="g", topic="t", key="", offset=1, message_id="m",
                               attempt=1, pid=0, handled_at=0)
        sqlqueue.publish("orders", {"n": 1}, id="both")
    with pytest.raises(RuntimeError), transaction.atomic(using="default"), \
            transaction.atomic(using="queue"):
        Handled.objects.create(group="g", topic="t", key="", offset=2, message_id="m",
                               attempt=1, pid=0, handled_at=0)
        sqlqueue.publish("orders", {"n": 2}, id="neither")
        raise RuntimeError("the domain write fails")
    assert list(Handled.objects.values_list("offset", flat=True)) == [1]
    assert list(QueueMessage.objects.using("queue").values_list("message_id", flat=True)) == [
        "both"]


# --------------------------------------------------------------------------- the worker


@pytest.mark.worker
@pytest.mark.django_db(databases=BOTH, transaction=True)
def test_a_worker_without_database_flag_handles_the_queue_databases_messages(queue_alias):
    with queue_settings():
        stored = sqlqueue.publish("orders", {"n": 1}, key="k")
    run = run_command("--burst", "--name", "w1", "--group", "billing", "--topic", "orders",
                      settings_module="tests.settings_queue_database", timeout=DEFAULT_TIMEOUT,
                      extra_env={NAME_VARIABLE: queue_alias})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "database=queue" in run.stderr
    # The handler's own write went to default, the worker's state to the queue database.
    assert list(Handled.objects.values_list("offset", flat=True)) == [stored.offset]
    assert ConsumerOffset.objects.using("queue").filter(consumer_group="billing",
                                                        offset_acked__gt=0).exists()
    assert not ConsumerOffset.objects.using("default").exists()


# --------------------------------------------------------------------------- what reads it


@pytest.mark.django_db(databases=BOTH)
def test_drain_stats_and_metrics_use_the_queue_database(on_queue_database):
    sqlqueue.publish("orders", {"n": 1}, key="k")
    assert drain("orders", "billing").handled == 1
    out = io.StringIO()
    call_command("sqlqueue", "stats", "--json", "--group", "billing", stdout=out)
    stats = json.loads(out.getvalue())
    assert [(s["topic"], s["group"], s["lag"]) for s in stats] == [("orders", "billing", 0)]
    assert [(r.topic, r.group) for r in DatabaseCollector().rows()] == [("orders", "billing")]
    assert not ConsumerOffset.objects.using("default").exists()
    out = io.StringIO()  # an explicit --database still wins
    call_command("sqlqueue", "stats", "--json", "--database", "default", stdout=out)
    assert json.loads(out.getvalue()) == []


@pytest.mark.django_db(databases=BOTH)
def test_the_admin_reads_the_queue_database(on_queue_database):
    stored = sqlqueue.publish("orders", {"n": 1}, id=f"admin-{uuid.uuid4().hex[:8]}")
    client = Client()
    client.force_login(User.objects.create_superuser("admin", password="pw"))
    page = client.get(reverse("admin:django_sqlqueue_queuemessage_changelist"))
    assert page.status_code == 200
    assert stored.id in page.content.decode()
    detail = client.get(reverse("admin:django_sqlqueue_queuemessage_change",
                                args=[stored.offset]))
    assert detail.status_code == 200


@pytest.mark.django_db(databases=BOTH)
def test_tasks_and_schedules_are_stored_on_the_queue_database(on_queue_database):
    from tests.testapp.tasks import noop

    result = noop.enqueue()
    assert noop.get_result(result.id).id == result.id
    schedules.add("nightly-alias", cron="0 3 * * *", task="tests.testapp.tasks.noop")
    assert rows("queue", topic="tasks.default") == 1
    assert Schedule.objects.using("queue").filter(name="nightly-alias").exists()
    assert rows("default") == 0
    assert not Schedule.objects.using("default").filter(name="nightly-alias").exists()


class _AppToQueue:
    """A project's own router sending the app to ``queue``, with no SQLQUEUE["DATABASE"]."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "queue" if model._meta.app_label == "django_sqlqueue" else None

    db_for_read = db_for_write


def test_without_the_setting_the_queue_database_is_where_the_routers_send_the_app():
    with override_settings(DATABASE_ROUTERS=[_AppToQueue()]):
        assert queue_database() == "queue"
        assert check_queue_database() == []


@pytest.mark.django_db(databases=BOTH)
def test_migrate_on_another_database_leaves_its_copy_of_the_queue_tables_alone():
    from django_sqlqueue.scheduling.definitions import sync_after_migrate

    declared = {"nightly": {"cron": "0 3 * * *", "task": "tests.testapp.tasks.noop"}}
    with queue_settings(SQLQUEUE={**settings.SQLQUEUE, "DATABASE": "queue",
                                  "SCHEDULES": declared}):
        sync_after_migrate(using="default")  # tables left from before the queue moved
        sync_after_migrate(using="queue")
    assert not Schedule.objects.using("default").exists()
    assert Schedule.objects.using("queue").filter(name="nightly").exists()
