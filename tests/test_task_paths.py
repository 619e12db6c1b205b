"""A message cannot make a process import code: only known tasks run or are read.

The known tasks are the @task functions of the installed apps' ``tasks`` modules and of the
modules in ``SQLQUEUE["TASK_MODULES"]``. A task path naming anything else (a module with
import side effects, a ``__main__`` module that runs a program) is dead-lettered by the
worker and refused by ``get_result()``, and the module is never imported: importing
``tests.import_marker`` or its ``__main__`` writes a marker file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

import django_sqlqueue as sqlqueue
from django_sqlqueue import schedules
from django_sqlqueue.models import QueueMessage, TaskResultRecord
from django_sqlqueue.scheduling.firing import fire
from django_sqlqueue.scheduling.spec import from_definition
from django_sqlqueue.tasks import UnknownTask
from django_sqlqueue.tasks.compat import InvalidTask, TaskResultDoesNotExist, task_backends
from django_sqlqueue.tasks.known import known_tasks, resolve
from tests import extra_tasks
from tests.testapp import tasks
from tests.worker_harness import wait_until, worker_pool

# A module with import side effects, and a __main__ module (as "venv.__main__.x" would run
# venv's program, which is not named here: a regression would run it in the test process).
MARKED = ("tests.import_marker.not_a_task", "tests.import_marker.__main__.run")
STRAY = ("this.anything", "os.system", "tests.testapp.tasks.record", "no.such.module")
EXTRA = {**settings.SQLQUEUE, "TASK_MODULES": ["tests.extra_tasks"]}


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file an import of tests.import_marker (or its __main__) would write."""
    path = tmp_path / "imported.txt"
    monkeypatch.setenv("SQLQUEUE_TEST_IMPORT_MARKER", str(path))
    assert not [name for name in sys.modules if name.startswith("tests.import_marker")]
    return path


def publish_task(path: str, result_id: str) -> None:
    sqlqueue.publish("tasks.default", {"id": result_id, "task": path, "backend": "default",
                                       "args": [], "kwargs": {}}, id=result_id)


def test_the_installed_apps_tasks_are_known_and_nothing_else():
    assert resolve("tests.testapp.tasks.add") is tasks.add
    for path in (*MARKED, *STRAY, "tests.extra_tasks.multiply"):
        assert resolve(path) is None
    assert all(path.startswith("tests.testapp.tasks.") for path in known_tasks())


def test_task_modules_adds_the_tasks_of_a_module_outside_the_apps():
    with override_settings(SQLQUEUE=EXTRA):
        assert resolve("tests.extra_tasks.multiply") is extra_tasks.multiply
    assert resolve("tests.extra_tasks.multiply") is None


@pytest.mark.django_db
def test_enqueue_refuses_a_task_no_worker_would_run():
    with pytest.raises(InvalidTask, match="TASK_MODULES"):
        extra_tasks.multiply.enqueue(2, 3)
    assert not QueueMessage.objects.filter(topic="tasks.default").exists()
    with override_settings(SQLQUEUE=EXTRA):
        assert extra_tasks.multiply.enqueue(2, 3).id


@pytest.mark.django_db
@pytest.mark.parametrize("path", MARKED)
def test_get_result_of_a_waiting_message_refuses_an_unknown_path_without_importing(
        marker, path):
    publish_task(path, "status-123")
    with pytest.raises(UnknownTask, match="not a known task") as raised:
        task_backends["default"].get_result("status-123")
    assert isinstance(raised.value, TaskResultDoesNotExist)  # a status view's "not found"
    assert isinstance(raised.value, sqlqueue.SQLQueueError)
    assert not marker.exists()
    assert not [name for name in sys.modules if name.startswith("tests.import_marker")]


@pytest.mark.django_db
@pytest.mark.parametrize("path", MARKED)
def test_get_result_of_a_result_row_refuses_an_unknown_path_without_importing(marker, path):
    TaskResultRecord.objects.create(id="status-9", task_path=path, backend="default",
                                    queue_name="default", enqueued_at=timezone.now())
    with pytest.raises(UnknownTask):
        task_backends["default"].get_result("status-9")
    assert not marker.exists()
    assert "tests.import_marker" not in sys.modules


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
@pytest.mark.compat
def test_the_worker_dead_letters_unknown_task_paths_without_importing_them(marker, tmp_path):
    for n, path in enumerate((*MARKED, *STRAY)):
        publish_task(path, f"stray-{n}")
    with override_settings(SQLQUEUE=EXTRA):
        extra = extra_tasks.multiply.enqueue(6, 7)
    real = tasks.add.enqueue(2, 3)
    with worker_pool(tmp_path) as pool:
        worker = pool.start("tasks-paths", "--queue", "default", settings=EXTRA,
                            extra_env={"SQLQUEUE_TEST_IMPORT_MARKER": str(marker)})
        dead = wait_until(
            lambda: (lambda rows: rows if len(rows) == len(MARKED) + len(STRAY) else None)(
                list(QueueMessage.objects.filter(topic="tasks.default_dlq"))),
            what="every unknown task path dead-lettered", watch=[worker])
        backend = task_backends["default"]
        with override_settings(SQLQUEUE=EXTRA):
            done = wait_until(
                lambda: all(backend.get_result(r.id).is_finished for r in (real, extra)),
                what="the known tasks finishing", watch=[worker])
            assert backend.get_result(extra.id).return_value == 42
    assert done
    assert backend.get_result(real.id).return_value == 5
    assert "poll cycle failed" not in worker.stderr
    assert sorted(m.original_id or m.message_id for m in dead) == sorted(
        f"stray-{n}" for n in range(len(MARKED) + len(STRAY)))
    assert all("unknown task path" in m.last_error for m in dead)
    assert not marker.exists(), marker.read_text()
    rows = TaskResultRecord.objects.filter(id__startswith="stray-")
    assert {r.status for r in rows} == {"FAILED"}
    assert all(r.errors[-1]["exception_class_path"].endswith("UnknownTask") for r in rows)


@pytest.mark.django_db
@pytest.mark.parametrize("path", MARKED)
def test_a_schedule_row_naming_an_unknown_task_fires_nothing_and_imports_nothing(marker, path):
    definition = {"cron": "0 3 * * *", "timezone": "UTC", "catch_up": "latest", "task": path,
                  "args": [], "kwargs": {}}
    with pytest.raises(UnknownTask):
        fire(from_definition("nightly", json.dumps(definition)), "schedule:nightly:1", "default")
    assert not QueueMessage.objects.exists()
    assert not marker.exists()
    assert not [name for name in sys.modules if name.startswith("tests.import_marker")]


@pytest.mark.django_db
def test_a_schedule_of_a_task_no_worker_would_run_is_refused():
    with pytest.raises(schedules.InvalidSchedule, match="TASK_MODULES"):
        schedules.add("nightly", cron="0 3 * * *", task="tests.extra_tasks.multiply")
    with override_settings(SQLQUEUE=EXTRA):
        schedules.add("nightly", cron="0 3 * * *", task="tests.extra_tasks.multiply")
