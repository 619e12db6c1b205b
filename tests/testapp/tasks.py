"""Tasks for the Tasks backend tests: each records its runs in the Handled table.

Per-task retry settings are given with ``task_options()``, so this module also imports
under Django's ImmediateBackend and DummyBackend (see test_tasks_portable.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import traceback
from typing import Any

import django_sqlqueue as sqlqueue
from django_sqlqueue.tasks import task_options

try:
    from django.tasks import task
    from django.tasks.signals import task_finished, task_started
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef,import-not-found,unused-ignore]
    from django_tasks.signals import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        task_finished,
        task_started,
    )

from .models import Handled

FAST_RETRY = sqlqueue.ExponentialBackoff(base=0.05, cap=0.2)
ONE_SECOND = sqlqueue.ExponentialBackoff(base=1.0, cap=1.0, jitter=False)


def record(label: str, attempt: int = 0, payload: Any = None, group: str = "tasks") -> None:
    Handled.objects.create(group=group, topic="tasks", key=label, offset=0, message_id="",
                           payload=payload, attempt=attempt, pid=os.getpid(),
                           handled_at=time.time())


@task
def noop() -> None:
    pass


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="ordered")
def remember(label: str, sleep: float = 0.0) -> str:
    record(label)
    time.sleep(sleep)
    return label


@task
@task_options(max_attempts=3, backoff=FAST_RETRY)
def always_fails(label: str) -> None:
    record(label)
    raise ValueError(f"boom {label}")


@task(takes_context=True)
@task_options(backoff=FAST_RETRY)
def flaky(context: Any, label: str) -> int:
    """Fails on its first attempt, succeeds on the second; returns the attempt number."""
    record(label, attempt=context.attempt)
    if context.attempt < 2:
        raise RuntimeError(f"first attempt of {label} fails")
    return int(context.attempt)


@task
async def double_later(n: int) -> int:
    await asyncio.sleep(0.01)
    return n * 2


@task(takes_context=True)
@task_options(max_attempts=3)
def long_first_attempt(context: Any, label: str, seconds: float) -> int:
    """Its first attempt runs for ``seconds`` (long enough to kill its worker); later ones
    return at once."""
    record(label, attempt=context.attempt)
    if context.attempt == 1:
        time.sleep(seconds)
    return int(context.attempt)


@task
def returns_a_set() -> Any:
    return {1, 2}


@task(takes_context=True)
@task_options(max_attempts=2, backoff=FAST_RETRY)
def fails_counting(context: Any, label: str) -> None:
    """Fails every attempt; records the attempt number the context gives."""
    record(label, attempt=context.attempt, payload=context.task_result.attempts)
    raise RuntimeError(f"attempt {context.attempt} of {label} fails")


@task(takes_context=True)
@task_options(backoff=ONE_SECOND)
def fails_once_then_waits(context: Any, label: str) -> int:
    """Fails its first attempt; the retry is due one second later."""
    record(label, attempt=context.attempt)
    if context.attempt < 2:
        raise RuntimeError(f"first attempt of {label} fails")
    return int(context.attempt)


@task(takes_context=True)
def interrupted_once(context: Any, label: str) -> int:
    """Raises KeyboardInterrupt on its first attempt, returns on the next."""
    record(label, attempt=context.attempt)
    if context.attempt < 2:
        raise KeyboardInterrupt
    return int(context.attempt)


def _record_signal(kind: str) -> Any:
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        record(f"{kind}:{task_result.id}", attempt=task_result.attempts,
               payload=str(task_result.status), group="signal")
        if sys.exc_info()[0] is not None:
            # What Django's own log receiver logs along with a FAILED task.
            record(f"{kind}:{task_result.id}", payload=traceback.format_exc(),
                   group="signal-exc-info")

    return receiver


_on_started = _record_signal("started")
_on_finished = _record_signal("finished")
# dispatch_uid: this module is imported again under other backends by the tests.
task_started.connect(_on_started, weak=False, dispatch_uid="tests.testapp.tasks.started")
task_finished.connect(_on_finished, weak=False, dispatch_uid="tests.testapp.tasks.finished")


def _log_run(log: str, key: str, sleep: float) -> None:
    """Append "start end pid key" to ``log`` (one O_APPEND write: whole lines from every
    worker process), for the limit tests to measure overlaps."""
    started = time.time()
    time.sleep(sleep)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{started:.6f} {time.time():.6f} {os.getpid()} {key} 0 1\n".encode())
    finally:
        os.close(fd)


@task
@task_options(concurrency_key="account:{account_id}", max_running=2)
def sync_account(account_id: int, log: str, sleep: float = 0.2) -> None:
    _log_run(log, f"account:{account_id}", sleep)


@task
@task_options(max_running=1)
def one_at_a_time(log: str, sleep: float = 0.1) -> None:
    _log_run(log, "single", sleep)


@task
def returns_text(label: str, codepoints: list[int], repeat: int = 1) -> str:
    """Returns the characters ``codepoints`` name (NUL included), ``repeat`` times."""
    record(label)
    return "".join(map(chr, codepoints)) * repeat


@task
@task_options(max_attempts=1)
def fails_with_text(label: str, codepoints: list[int], repeat: int = 1) -> None:
    """Raises a ValueError whose message is the characters ``codepoints`` name."""
    record(label)
    raise ValueError("".join(map(chr, codepoints)) * repeat)


@task
@task_options(concurrency_key="ledger:{ledger}", max_running=1)
def post_to_ledger(ledger: int, log: str, sleep: float = 0.2) -> None:
    """One at a time per ledger, whichever queue it was enqueued on."""
    _log_run(log, f"ledger:{ledger}", sleep)
