"""``sqlqueue_wsgi``: a WSGI application that runs a queue worker beside the one it wraps.

WSGI has no start-up or shutdown events: the worker starts on the first request (or when
the wrapper is made, with ``start="import"``) and stops gracefully at interpreter exit.
Under ``manage.py runserver``'s autoreloader, which restarts the process on every code
change, it stays off unless ``autoreload=True`` (``SQLQUEUE["EMBEDDED"]["AUTORELOAD"]``).
Under gunicorn, prefer the hooks of :mod:`django_sqlqueue.embedded.gunicorn`, which stop
it when gunicorn stops the web process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from .lifetime import stop_at_exit
from .options import embedded_options
from .runner import EmbeddedWorker

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class EmbeddedWSGI:
    """The wrapper :func:`sqlqueue_wsgi` returns; ``worker`` is its embedded worker."""

    def __init__(self, app: WSGIApp, worker: EmbeddedWorker, start: str) -> None:
        self.app = app
        self.worker = worker
        self._lock = threading.Lock()
        if start == "import":
            self.start()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not self.worker.settled:
            self.start()
        return self.app(environ, start_response)

    def start(self) -> bool:
        """Start the worker unless it runs already or is off here; True when it runs."""
        with self._lock:
            if self.worker.settled:
                return self.worker.started
            if not self.worker.start():
                return False
            stop_at_exit(self.worker)
            return True


def sqlqueue_wsgi(app: WSGIApp, *, group: list[str] | str | None = None,
                  topic: list[str] | str | None = None, queue: list[str] | str | None = None,
                  name: str | None = None, concurrency: int | None = None,
                  schedules: bool | None = None, enabled: bool | None = None,
                  processes: str | None = None, autoreload: bool | None = None,
                  start: str | None = None) -> EmbeddedWSGI:
    """Wrap the WSGI application ``app`` so that its process also runs a queue worker;
    the keywords are :func:`~django_sqlqueue.embedded.sqlqueue_asgi`'s."""
    worker = EmbeddedWorker(group=group, topic=topic, queue=queue, name=name,
                            concurrency=concurrency, schedules=schedules, enabled=enabled,
                            processes=processes, autoreload=autoreload, start=start)
    return EmbeddedWSGI(app, worker, embedded_options(**worker.overrides).start)
