"""gunicorn server hooks that run a queue worker in each web process, or in one of them.

In ``gunicorn.conf.py``::

    from django_sqlqueue.embedded.gunicorn import post_fork, worker_exit

``post_fork`` starts the worker in the new web process once Django has loaded (gunicorn
forks before it imports the application); ``worker_exit`` stops it gracefully when
gunicorn stops that process (SIGTERM, a reload, ``max_requests``), telling the arbiter
the process is alive meanwhile. ``SQLQUEUE["EMBEDDED"]["PROCESSES"] = "one"`` runs a
worker in only one of the server's processes; another takes over if that one exits.
To pass keyword arguments instead of settings, call :func:`embedded_hooks`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .lifetime import exit_when_abandoned
from .runner import EmbeddedWorker

logger = logging.getLogger("django_sqlqueue.embedded")

NOTIFY_EVERY = 1.0  # seconds between the heartbeats a stopping web process sends gunicorn

Hook = Callable[[Any, Any], None]  # (server, worker), as gunicorn calls its hooks

_worker: EmbeddedWorker | None = None


def post_fork(server: Any, worker: Any, **overrides: Any) -> None:
    """gunicorn's ``post_fork`` hook: start this web process's embedded worker."""
    global _worker
    _worker = EmbeddedWorker(server_pid=getattr(server, "pid", None), **overrides)
    _worker.start(when_apps_ready=True)


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn's ``worker_exit`` hook: stop the embedded worker, finishing (or handing
    back) its in-flight messages within ``SHUTDOWN_GRACE``."""
    global _worker
    embedded, _worker = _worker, None
    if embedded is None:
        return
    _stop_telling_gunicorn(worker, embedded)
    exit_when_abandoned(embedded.exit_code, delay=0.0)


def embedded_hooks(**overrides: Any) -> tuple[Hook, Hook]:
    """``post_fork, worker_exit = embedded_hooks(group=["billing"], concurrency=2)``: the
    hooks with keyword arguments over ``SQLQUEUE["EMBEDDED"]``."""

    def fork_hook(server: Any, worker: Any) -> None:
        post_fork(server, worker, **overrides)

    return fork_hook, worker_exit


def _stop_telling_gunicorn(worker: Any, embedded: EmbeddedWorker) -> None:
    """Stop the embedded worker in a thread while this one keeps telling gunicorn's
    arbiter the web process is alive: a long shutdown grace must not get it killed as a
    hung worker (``timeout``)."""
    stopper = threading.Thread(target=embedded.stop, name="sqlqueue-embedded-stop",
                               daemon=True)
    stopper.start()
    notify = getattr(worker, "notify", None)
    while stopper.is_alive():
        if callable(notify):
            try:
                notify()
            except Exception:  # noqa: BLE001 - a heartbeat file gone at exit is harmless
                logger.debug("gunicorn heartbeat failed", exc_info=True)
        stopper.join(NOTIFY_EVERY)
