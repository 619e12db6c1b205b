"""The embedded worker: ``runqueueworker``'s engines in a thread of a web process.

One supervising thread selects the subscriptions as the command does, runs a
:class:`~django_sqlqueue.worker.process.Worker` per database alias (the command's
engines, with the same leases, fencing, heartbeats and drain on stop), and restarts
them with a growing pause when they crash or stop on their own. Outside the main thread a
worker installs no signal handlers: the web server keeps its own, and stops this one
through :meth:`EmbeddedWorker.stop`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..conf import get_settings, queue_database
from ..exceptions import ConfigurationError
from .exclusive import ProcessLock, lock_path
from .options import EmbeddedOptions, embedded_options

if TYPE_CHECKING:
    from ..consuming.registry import Subscription
    from ..worker.process import Worker

logger = logging.getLogger("django_sqlqueue.embedded")

RESTART_DELAY = 1.0  # seconds before the first restart of a crashed worker; doubles after
MAX_RESTART_DELAY = 60.0  # seconds; the longest pause between restarts
HEALTHY_RUN = 60.0  # seconds a worker must have run for its next crash to restart it at once
LOCK_RETRY = 1.0  # seconds between tries at the lock of PROCESSES = "one"
APPS_WAIT = 0.05  # seconds between looks at whether Django finished loading the apps
# Seconds stop() waits beyond SHUTDOWN_GRACE: the last outcomes recorded, leases released.
STOP_MARGIN = 10.0


@dataclass(frozen=True)
class Plan:
    """What to run: the options in force, the worker's name and its subscriptions."""

    options: EmbeddedOptions
    name: str
    subscriptions: list[Subscription]


class EmbeddedWorker:
    """A queue worker inside this process; ``start()`` once, ``stop()`` on the way out.

    ``overrides`` are keyword arguments named like runqueueworker's options, over
    ``SQLQUEUE["EMBEDDED"]``: ``group``, ``topic``, ``queue`` (lists), ``name``,
    ``concurrency``, ``schedules``, and ``enabled``, ``processes``, ``autoreload``,
    ``start``.
    """

    def __init__(self, *, server_pid: int | None = None, **overrides: Any) -> None:
        self.overrides = overrides
        self.server_pid = server_pid  # whose forked processes PROCESSES = "one" counts
        self.restarts = 0  # restarts after a crash, for the log and the tests
        self.exit_code = 0  # the last run's exit status once stopped
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._workers: list[Worker] = []
        self._exclusive: ProcessLock | None = None
        self._grace = 0.0  # SHUTDOWN_GRACE, read with the options (0 before)
        self._off = False  # the options turned it off in this process

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def settled(self) -> bool:
        """Whether ``start()`` has decided: started, or turned off here."""
        return self._thread is not None or self._off

    @property
    def running(self) -> bool:
        """Whether its engines run right now (not waiting for a lock or a restart)."""
        with self._lock:
            return bool(self._workers)

    def start(self, *, when_apps_ready: bool = False) -> bool:
        """Select the subscriptions and start the supervising thread; False when the options
        turn the worker off here. A bad option or selection raises ConfigurationError.

        ``when_apps_ready``: return at once, and let the thread wait for Django to load
        (gunicorn's ``post_fork`` runs before the application is imported); errors are
        then logged.
        """
        with self._lock:
            if self._thread is not None or self._stopping.is_set() or self._off:
                return self._thread is not None
            plan = None if when_apps_ready else self._plan()
            if not when_apps_ready and plan is None:
                self._off = True
                return False
            self._thread = threading.Thread(target=self._main, args=(plan,), daemon=True,
                                            name="sqlqueue-embedded")
            self._thread.start()
            return True

    def stop(self) -> int:
        """Stop gracefully: in-flight handlers get ``SHUTDOWN_GRACE`` to finish, their
        outcomes are recorded and the leases released. Returns the worker's exit status
        (3: handlers were still running after the grace)."""
        self._stopping.set()
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # Before the options were read the thread only waits, and wakes at once.
            thread.join(self._grace + STOP_MARGIN)
            if thread.is_alive():
                logger.warning("embedded worker still stopping after %.0fs; leaving it",
                               self._grace + STOP_MARGIN)
        return self.exit_code

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the supervising thread to end; True once it has."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    # ------------------------------------------------------------------ the thread

    def _plan(self) -> Plan | None:
        """The options and the selected subscriptions, or None when turned off here."""
        from django.core.management.base import CommandError

        from ..management.worker_selection import _select
        from ..worker.process import default_worker_name

        options = embedded_options(**self.overrides)
        if not options.active():
            logger.info("embedded worker off here enabled=%s autoreload=%s", options.enabled,
                        options.autoreload)
            return None
        name = options.name or default_worker_name()
        try:
            selected = _select(options.selection(), name)
        except CommandError as exc:
            raise ConfigurationError(f"embedded worker: {exc}") from exc
        self._grace = get_settings().shutdown_grace
        return Plan(options, name, selected)

    def _main(self, plan: Plan | None) -> None:
        from django.db import connections

        show_log_lines()
        try:
            if plan is None:
                plan = self._plan_when_ready()
            if plan is not None:
                self._supervise(plan)
        except Exception:
            logger.exception("embedded worker cannot start")
        finally:
            if self._exclusive is not None:
                self._exclusive.release()
            connections.close_all()  # this thread's own

    def _plan_when_ready(self) -> Plan | None:
        from django.apps import apps

        while not apps.ready:
            if self._stopping.wait(APPS_WAIT):
                return None
        return self._plan()

    def _supervise(self, plan: Plan) -> None:
        delay = RESTART_DELAY
        if plan.options.processes == "one":
            self._exclusive = ProcessLock(lock_path(_scope(plan), self.server_pid))
        while not self._stopping.is_set():
            if self._exclusive is not None and not self._exclusive.acquire():
                self._stopping.wait(LOCK_RETRY)
                continue
            began = time.monotonic()
            code, reason = self._run_once(plan)
            if self._stopping.is_set():
                self.exit_code = code
                if code:
                    logger.warning("embedded worker stopped status=%s reason=%s", code, reason)
                return
            if time.monotonic() - began >= HEALTHY_RUN:
                delay = RESTART_DELAY
            self.restarts += 1
            logger.error("embedded worker stopped unexpectedly name=%s status=%s reason=%s; "
                         "restarting in %.1fs restarts=%s", plan.name, code, reason or "-",
                         delay, self.restarts)
            self._stopping.wait(delay)
            delay = min(delay * 2, MAX_RESTART_DELAY)

    def _run_once(self, plan: Plan) -> tuple[int, str]:
        """Run the engines until they stop; their exit status and reason."""
        from ..worker.engines import run_engines

        workers: list[Worker] = []
        try:
            workers = self._engines(plan)
            with self._lock:
                if self._stopping.is_set():
                    return 0, ""
                self._workers = workers
            worker = run_engines(workers, self._grace)
            return worker.exit_code, worker.exit_reason
        except Exception as exc:
            logger.exception("embedded worker crashed name=%s", plan.name)
            for engine in workers:
                engine.stop()
                engine.dispatcher.shutdown(wait=False)
            return 1, f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._workers = []

    def _engines(self, plan: Plan) -> list[Worker]:
        """runqueueworker's engines: one per alias the selected topics live on, the
        schedules fired by the one on the queue's own alias."""
        from ..worker.engines import build_engines

        options = plan.options
        return build_engines(plan.subscriptions, name=plan.name,
                             concurrency=options.concurrency, schedules=options.schedules)


def _scope(plan: Plan) -> str:
    """What identifies this worker's project and subscriptions, for the lock of
    ``PROCESSES = "one"``."""
    from django.conf import settings

    subscriptions = sorted(f"{s.group}:{s.topic}" for s in plan.subscriptions)
    return f"{settings.SETTINGS_MODULE} {queue_database()} {' '.join(subscriptions)}"


def show_log_lines() -> None:
    """Send the package's log lines (worker started, stopped, restarted) to stderr at
    INFO, as runqueueworker does, unless the project configured logging itself."""
    logger = logging.getLogger("django_sqlqueue")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
