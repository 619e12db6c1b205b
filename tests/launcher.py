"""A fork server for the tests' worker processes: Django imported and set up once, each
``python -m django <command>`` forked from it instead of started afresh.

Started by :mod:`tests.launcher_client` as ``python -m tests.launcher <fd>`` with the
environment a worker gets (``tests.worker_harness.worker_env()`` without overrides). It
imports what a worker needs, closes every database connection and then serves requests
on the Unix socket ``<fd>`` (SOCK_SEQPACKET, one message per request): a JSON object
(``args`` after ``python -m django``, ``env``, ``cwd``) with the worker's stdin, stdout and
stderr attached as file descriptors. It answers ``{"pid": N}``; on end of file it exits.

Why a double fork to a subreaper: the test process needs Popen's exact powers over a
worker: signal it while its pid cannot be reused, poll it, and read its real exit status
(a negative one for a signal). The test process marks itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``); the launcher forks an intermediate child that forks the
worker and exits at once, so the orphaned worker is re-parented to the test process, and
only after reaping the intermediate does the launcher reply with the pid. The test
process then waits for the worker as for any child. Having the launcher report exit
statuses instead would need a second channel, a launcher that never dies first, and still
leave a window in which a reaped pid could be reused before a signal is sent.

A forked worker must behave as a fresh ``python -m django`` would:

- Nothing imported here reads a setting that a worker may override (``SQLQUEUE_TEST_SETTINGS``)
  and keeps it: the apps' ``queues.py`` modules, whose ``@subscriber`` defaults come from
  ``SQLQUEUE``, are left for the worker to import, and task backends (which read
  ``SQLQUEUE`` when built) are dropped in the worker, whose settings module is evaluated
  again under its own environment for a new ``SQLQUEUE`` dict.
- Its signal dispositions are those this process was started with (the ones a subprocess
  of the test process gets), and it stays in the test process's process group, as a
  subprocess did.
- The command runs at the top level of this module, so SystemExit, an uncaught exception
  (traceback, status 1), KeyboardInterrupt (death by SIGINT), the wait for non-daemon
  threads and atexit handlers are the interpreter's own.

What still differs: every forked worker shares this process's hash seed (nothing in the
app depends on ``hash()``), and a warning printed once while importing here is not
printed again by each worker.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import json
import os
import pkgutil
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 1 << 20  # bytes; a request is a JSON object with a whole environment
STDIO_FDS = 3  # stdin, stdout and stderr travel with each request
# Packages a worker imports as it starts and runs, imported whole here. The apps'
# queues.py modules are deliberately not among them (see the module docstring).
PRELOADED_PACKAGES = (
    "django_sqlqueue.worker",
    "django_sqlqueue.consuming",
    "django_sqlqueue.store",
    "django_sqlqueue.models",
    "django_sqlqueue.db",
    "django_sqlqueue.metrics",
    "django_sqlqueue.management",
    "django_sqlqueue.operations",
)
PRELOADED_MODULES = (
    "django_sqlqueue.checks",
    "django_sqlqueue.tasks.backend",
    "django_sqlqueue.tasks.checks",
    "django_sqlqueue.tasks.queues",
    "django_sqlqueue.tasks.runner",
    "django.core.management.commands.shell",
    "django.core.checks.database",
    "django.db.models.sql.compiler",
    "tests.testapp.tasks",
)
TASK_MODULES_MISSING = "django_sqlqueue.tasks needs Django's Tasks framework"

Dispositions = dict[int, Any]  # signal number -> handler


@dataclass(frozen=True)
class Request:
    """A worker to start: ``python -m django <args>`` in ``cwd`` with exactly ``env``."""

    args: list[str]
    env: dict[str, str]
    cwd: str
    stdio: list[int]  # stdin, stdout, stderr


# --------------------------------------------------------------------------- messages


def send(channel: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """One message (JSON, with file descriptors attached when given)."""
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(channel, [data], fds)
    else:
        channel.send(data)


def receive(channel: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The next message and its file descriptors; EOFError once the peer is gone."""
    data, fds, flags, _ = socket.recv_fds(channel, MAX_MESSAGE, STDIO_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a message over {MAX_MESSAGE} bytes or {STDIO_FDS} descriptors")
    return json.loads(data), fds


# --------------------------------------------------------------------------- start-up


def preload() -> None:
    """Set Django up and import what a worker would, leaving no connection open."""
    import django

    django.setup()
    from django.core.checks import run_checks
    from django.core.management import get_commands, load_command_class
    from django.db import connections

    for package in PRELOADED_PACKAGES:
        _import_package(package)
    for name in PRELOADED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            # Django 5.2 without django-tasks: a worker runs no task queue there either.
            if TASK_MODULES_MISSING not in str(exc):
                raise
    for engine in {db["ENGINE"] for db in connections.settings.values()}:
        importlib.import_module(f"{engine}.base")
        if importlib.util.find_spec(f"{engine}.compiler"):  # MySQL's, imported at a query
            importlib.import_module(f"{engine}.compiler")
    load_command_class(get_commands()["runqueueworker"], "runqueueworker")
    # What the system checks import (URLs, templates, admin): every command runs them.
    run_checks()
    _check_forkable()
    connections.close_all()
    # Objects alive now are shared with every worker: kept out of the collector's reach,
    # a worker's collections do not copy the pages they live in.
    gc.freeze()


def _import_package(name: str) -> None:
    package = importlib.import_module(name)
    for module in pkgutil.walk_packages(package.__path__, f"{name}."):
        importlib.import_module(module.name)


def _check_forkable() -> None:
    """Refuse to serve when what was imported here would make workers differ."""
    from django_sqlqueue.consuming.registry import subscriptions

    if subscriptions():
        raise RuntimeError("an app's queues.py was imported before fork: its @subscriber "
                           "defaults would miss a worker's SQLQUEUE overrides")
    if threading.active_count() != 1:
        raise RuntimeError(f"{threading.active_count()} threads alive: forking needs one")


# --------------------------------------------------------------------------- serving


def serve(channel: socket.socket, dispositions: Dispositions) -> Request:
    """Fork a worker for each request until the test process goes away. Returns only in a
    forked worker, with its request."""
    while True:
        try:
            message, stdio = receive(channel)
        except EOFError:
            sys.exit(0)
        try:
            request = Request(list(message["args"]), dict(message["env"]), str(message["cwd"]),
                              stdio)
            if len(stdio) != STDIO_FDS:
                raise ValueError(f"{len(stdio)} file descriptors, not {STDIO_FDS}")
            pid = fork_worker(functools.partial(_prepare, request, channel, dispositions))
        except Exception as exc:  # noqa: BLE001 - the client falls back to a subprocess
            send(channel, {"error": f"{type(exc).__name__}: {exc}"})
        else:
            if pid is None:
                return request
            send(channel, {"pid": pid})
        finally:
            if os.getpid() == _launcher_pid:
                for fd in stdio:
                    os.close(fd)


def fork_worker(prepare: Callable[[], None]) -> int | None:
    """Fork a worker that is no child of this process: the pid in the launcher, None in the
    worker (after ``prepare()``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid_reader, pid_writer = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        os.close(pid_reader)
        try:
            worker = os.fork()
        except BaseException:  # noqa: BLE001 - reported by the empty pipe
            os._exit(1)
        if worker == 0:
            os.close(pid_writer)
            try:
                prepare()
            except BaseException:
                # Never back into the serving loop: this process is no launcher.
                traceback.print_exc()
                os._exit(1)
            return None
        os.write(pid_writer, str(worker).encode())
        os._exit(0)
    os.close(pid_writer)
    with os.fdopen(pid_reader, "rb") as pipe:
        reported = pipe.read()
    # Once the intermediate child is reaped, the worker has been re-parented.
    _, status = os.waitpid(intermediate, 0)
    if not reported or os.waitstatus_to_exitcode(status) != 0:
        raise OSError("could not fork a worker")
    return int(reported)


def _prepare(request: Request, channel: socket.socket, dispositions: Dispositions) -> None:
    """Make this forked process what ``python -m django <args>`` would be at start-up."""
    channel.close()
    for target, fd in enumerate(request.stdio):
        os.dup2(fd, target)
        os.close(fd)
    for signum, handler in dispositions.items():
        signal.signal(signum, handler)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    # python -m puts the module's file first (ManagementUtility names itself after it).
    sys.argv = [_DJANGO_MAIN, *request.args]


def apply_worker_settings() -> None:
    """Apply the settings a fresh worker would have read under this environment."""
    from django.conf import settings

    if os.environ.get("SQLQUEUE_TEST_SETTINGS"):
        # Evaluated again, as a fresh process would; a new dict, so the SQLQUEUE settings
        # cached for the old one are rebuilt (django_sqlqueue.conf).
        spec = importlib.util.find_spec(os.environ["DJANGO_SETTINGS_MODULE"])
        assert spec is not None and spec.loader is not None
        fresh = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        settings.SQLQUEUE = fresh.SQLQUEUE
    _drop_task_backends()


def _drop_task_backends() -> None:
    """Task backends read SQLQUEUE when built (tests.testapp.tasks built them here)."""
    try:
        from django_sqlqueue.tasks.compat import task_backends
    except ImportError:
        return
    for backend in task_backends.all(initialized_only=True):
        del task_backends[backend.alias]


# --------------------------------------------------------------------------- main


def inherited_dispositions() -> Dispositions:
    """The signal handlers this process started with: what a subprocess of the test
    process gets, so what every worker gets back."""
    dispositions: Dispositions = {}
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.getsignal(signum)
        if handler is not None:  # None: not set from Python, and left alone
            dispositions[signum] = handler
    return dispositions


_launcher_pid = os.getpid()
_DJANGO_MAIN = str(getattr(importlib.util.find_spec("django.__main__"), "origin", ""))


def main() -> None:
    dispositions = inherited_dispositions()
    # Ctrl-C reaches the whole process group: the test process decides when this ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = socket.socket(fileno=int(sys.argv[1]))
    try:
        preload()
    except BaseException:
        send(channel, {"error": traceback.format_exc()})
        raise
    send(channel, {"ready": os.getpid()})
    serve(channel, dispositions)
    apply_worker_settings()
    from django.core import management

    management.execute_from_command_line()


if __name__ == "__main__":
    main()
