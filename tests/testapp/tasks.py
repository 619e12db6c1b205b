"""Tasks for the Tasks backend tests: each records its runs in the Handled table."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import django_sqlqueue as sqlqueue

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


@task(max_attempts=3, backoff=FAST_RETRY)
def always_fails(label: str) -> None:
    record(label)
    raise ValueError(f"boom {label}")


@task(takes_context=True, backoff=FAST_RETRY)
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


@task(takes_context=True, max_attempts=3)
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


def _record_signal(kind: str) -> Any:
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        record(f"{kind}:{task_result.id}", attempt=task_result.attempts,
               payload=str(task_result.status), group="signal")

    return receiver


_on_started = _record_signal("started")
_on_finished = _record_signal("finished")
task_started.connect(_on_started, weak=False)
task_finished.connect(_on_finished, weak=False)
