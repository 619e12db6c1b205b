"""Helpers shared by the test modules: threads with their own connection, row lookups."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_sqlqueue.models import QueueMessage

# How long a test waits for a helper thread before declaring it stuck.
THREAD_TIMEOUT = 30.0


class DBThread(threading.Thread):
    """Run ``target(*args, **kwargs)`` in a thread, which gets its own database connection.

    Django opens one connection per thread, so work done here is a second client of
    the database. The thread closes its connections when it ends. ``outcome()`` joins
    it and returns the result or re-raises the exception it died with.
    """

    def __init__(self, target: Callable[..., Any], *args: Any, name: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self._target_args = args
        self._target_kwargs = kwargs
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None

    def run(self) -> None:
        try:
            self.result = self._target_fn(*self._target_args, **self._target_kwargs)
        except BaseException as exc:  # re-raised by outcome() in the test's thread
            self.error = exc
        finally:
            self.finished_at = time.monotonic()
            connections.close_all()

    def outcome(self, timeout: float = THREAD_TIMEOUT) -> Any:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name} still running after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result


def start_thread(target: Callable[..., Any], *args: Any, name: str | None = None,
                 **kwargs: Any) -> DBThread:
    thread = DBThread(target, *args, name=name, **kwargs)
    thread.start()
    return thread


def outcomes(threads: list[DBThread], timeout: float = THREAD_TIMEOUT) -> list[Any]:
    """Join every thread, then return their results or re-raise the first failure.

    Joining all of them first keeps a failed test from leaving threads (and their open
    transactions) running into the next test's database cleanup.
    """
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread.outcome(timeout=0) for thread in threads]


def in_other_connection(target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``target`` on a second database connection and return its result."""
    return start_thread(target, *args, **kwargs).outcome()


def message_count(**filters: Any) -> int:
    return QueueMessage.objects.filter(**filters).count()


def positions_by_offset(**filters: Any) -> dict[int, int | None]:
    """{offset: position} of the matching rows, read fresh from the database."""
    return dict(
        QueueMessage.objects.filter(**filters).order_by("offset").values_list("offset", "position")
    )


def now_ms() -> int:
    """The local clock in epoch milliseconds (the database server runs on this host)."""
    return int(time.time() * 1000)
