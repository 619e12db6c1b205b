"""The tasks this project runs, so a message can never make a process import code.

A task message names its task by dotted path, and anyone who can publish to ``tasks.*`` or
write a row chooses that text. Importing it would run any module's code (``this``,
``venv.__main__``), so a path is looked up, never imported: the known tasks are the ``@task``
functions found, once per process, in every installed app's ``tasks`` module (and the
submodules it imports) and in the modules ``SQLQUEUE["TASK_MODULES"]`` lists for tasks
defined elsewhere. Any other path is unknown: the worker dead-letters its message,
``get_result()`` raises :class:`UnknownTask`, ``enqueue()`` refuses the task.
"""

from __future__ import annotations

import sys
import threading
from importlib import import_module
from typing import Any

from django.apps import apps
from django.utils.module_loading import module_has_submodule

from ..conf import get_settings
from ..exceptions import ConfigurationError, SQLQueueError
from ..logtext import loggable
from .compat import Task, TaskResultDoesNotExist

MODULE_NAME = "tasks"  # each installed app's module searched for @task functions

_lock = threading.RLock()  # a tasks module may enqueue as it is imported
_found: tuple[object, dict[str, Any]] | None = None  # (what was searched, path → Task)


class UnknownTask(SQLQueueError, TaskResultDoesNotExist):
    """A result or message names a task path this project does not define; nothing was
    imported. A ``TaskResultDoesNotExist``, so a status view's "not found" handles it."""


def task_modules() -> list[str]:
    """The modules searched for tasks: each installed app's ``tasks``, then TASK_MODULES."""
    found = [f"{config.name}.{MODULE_NAME}" for config in apps.get_app_configs()
             if module_has_submodule(config.module, MODULE_NAME)]
    return list(dict.fromkeys([*found, *_listed()]))


def known_tasks() -> dict[str, Any]:
    """Every known task by its path (``Task.module_path``), found on the first call (and
    again when the installed apps or TASK_MODULES change, as tests change them).

    Raises ConfigurationError naming a module that cannot be imported.
    """
    global _found
    searched = (tuple(config.name for config in apps.get_app_configs()), tuple(_listed()))
    with _lock:
        if _found is None or _found[0] != searched:
            _found = (searched, _discover(task_modules()))
        return _found[1]


def resolve(path: str) -> Any | None:
    """The known task at ``path``, or None: ``path`` itself is never imported."""
    return known_tasks().get(path) if isinstance(path, str) else None


def resolve_or_raise(path: str, result_id: str) -> Any:
    """The known task at ``path``; UnknownTask, saying which result names it, if none."""
    task = resolve(path)
    if task is None:
        raise UnknownTask(
            f"result {loggable(result_id, 200)!r} names {loggable(path, 300)!r}, which is not a "
            "known task (see 'Which tasks run' in the django-sqlqueue Tasks documentation)")
    return task


def _listed() -> list[str]:
    listed = get_settings().task_modules
    return list(listed) if isinstance(listed, list | tuple) else []  # else: sqlqueue.E058


def _discover(modules: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in modules:
        try:
            import_module(name)
        except Exception as exc:
            raise ConfigurationError(
                f"could not import {name} to find its tasks: {type(exc).__name__}: {exc}"
            ) from exc
        # A tasks package's submodules count once it has imported them.
        for module_name, module in list(sys.modules.items()):
            if module is None or not (module_name == name or module_name.startswith(name + ".")):
                continue
            for value in list(vars(module).values()):
                if isinstance(value, Task):
                    found.setdefault(value.module_path, value)
    return found
