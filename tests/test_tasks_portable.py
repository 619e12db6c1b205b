"""One task module under any backend: per-task retry settings given with task_options()
leave Django's ImmediateBackend and DummyBackend working (the setup docs/tasks.md
recommends for tests), and QueueBackend reads them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from django.test import override_settings

from django_sqlqueue.tasks.compat import SOURCE, TaskResultStatus, task_backends
from django_sqlqueue.tasks.options import retry_settings
from tests.testapp import tasks
from tests.testapp.models import Handled

pytestmark = pytest.mark.django_db

FRAMEWORK = "django.tasks" if SOURCE == "django.tasks" else "django_tasks"
IMMEDIATE = {"default": {"BACKEND": f"{FRAMEWORK}.backends.immediate.ImmediateBackend",
                         "QUEUES": ["default", "ordered"]}}
DUMMY = {"default": {"BACKEND": f"{FRAMEWORK}.backends.dummy.DummyBackend",
                     "QUEUES": ["default", "ordered"]}}


def import_tasks_module() -> ModuleType:
    """tests/testapp/tasks.py imported afresh, under whatever TASKS is in force (the
    module in sys.modules stays as it is, for the other tests)."""
    spec = importlib.util.spec_from_file_location(tasks.__name__, Path(tasks.__file__))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_task_module_imports_and_runs_under_the_immediate_backend():
    with override_settings(TASKS=IMMEDIATE):
        module = import_tasks_module()
        added = module.add.enqueue(2, 3)
        failed = module.always_fails.enqueue("immediate")
        context = module.flaky.enqueue("immediate-ctx")

    assert (added.status, added.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    # ImmediateBackend runs a task once: it ignores the retry settings, as it should.
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError"]
    assert context.status == TaskResultStatus.FAILED  # its first attempt always fails
    assert Handled.objects.filter(key="immediate").count() == 1


def test_the_task_module_imports_under_the_dummy_backend():
    with override_settings(TASKS=DUMMY):
        module = import_tasks_module()
        result = module.always_fails.enqueue("dummy")
    assert result.status == TaskResultStatus.READY
    assert not Handled.objects.exists()


def test_the_queue_backend_reads_the_retry_settings_of_the_same_module():
    module = import_tasks_module()
    defaults = task_backends["default"].queue_options  # OPTIONS MAX_ATTEMPTS: 2

    assert retry_settings(module.always_fails, defaults) == (3, module.FAST_RETRY)
    assert retry_settings(module.flaky, defaults) == (2, module.FAST_RETRY)
    assert retry_settings(module.add, defaults) == (2, defaults.backoff)


def test_task_options_above_task_work_as_well():
    from django_sqlqueue.tasks import task_options

    defaults = task_backends["default"].queue_options
    decorated = task_options(max_attempts=7)(tasks.task(tasks.noop.func))
    assert retry_settings(decorated, defaults)[0] == 7
