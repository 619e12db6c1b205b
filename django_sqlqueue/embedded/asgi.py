"""``sqlqueue_asgi``: an ASGI application that runs a queue worker beside the one it wraps.

The worker starts on the lifespan ``startup`` event and stops on ``shutdown``, both in a
thread of their own: the event loop never waits on the database or a handler. A server
that sends no lifespan events (``uvicorn --lifespan off``, some others) gets the worker
started by the first request (or when the wrapper is made, with ``start="import"``) and
stopped at interpreter exit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .lifetime import exit_when_abandoned, stop_at_exit
from .runner import EmbeddedWorker

logger = logging.getLogger("django_sqlqueue.embedded")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class EmbeddedASGI:
    """The wrapper :func:`sqlqueue_asgi` returns; ``worker`` is its embedded worker."""

    def __init__(self, app: ASGIApp, worker: EmbeddedWorker, start: str | None) -> None:
        self.app = app
        self.worker = worker
        self._lifespan = False  # the server sent lifespan events: they start and stop it
        self._lazy_lock = threading.Lock()
        if start == "import":
            self._start_without_lifespan()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
            return
        if not self._lifespan and not self.worker.settled:
            await asyncio.to_thread(self._start_without_lifespan)
        await self.app(scope, receive, send)

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        """Answer the lifespan events (Django's own handler takes none)."""
        self._lifespan = True
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(self.worker.start)
                except Exception as exc:  # noqa: BLE001 - the server reports it and exits
                    logger.exception("embedded worker cannot start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                code = await asyncio.to_thread(self.worker.stop)
                await send({"type": "lifespan.shutdown.complete"})
                exit_when_abandoned(code)
                return

    def _start_without_lifespan(self) -> None:
        with self._lazy_lock:
            if not self.worker.settled and self.worker.start():
                stop_at_exit(self.worker)


def sqlqueue_asgi(app: ASGIApp, *, group: list[str] | str | None = None,
                  topic: list[str] | str | None = None, queue: list[str] | str | None = None,
                  name: str | None = None, concurrency: int | None = None,
                  schedules: bool | None = None, enabled: bool | None = None,
                  processes: str | None = None, autoreload: bool | None = None,
                  start: str | None = None) -> EmbeddedASGI:
    """Wrap the ASGI application ``app`` so that its process also runs a queue worker.

    The keywords are runqueueworker's options (``group``, ``topic``, ``queue`` take lists;
    ``schedules=False`` is ``--no-schedules``); each left out comes from
    ``SQLQUEUE["EMBEDDED"]``. With no group, topic or queue, every subscription and task
    queue runs.
    """
    worker = EmbeddedWorker(group=group, topic=topic, queue=queue, name=name,
                            concurrency=concurrency, schedules=schedules, enabled=enabled,
                            processes=processes, autoreload=autoreload, start=start)
    if start is None:
        from .options import embedded_options

        start = embedded_options(**worker.overrides).start
    return EmbeddedASGI(app, worker, start)
