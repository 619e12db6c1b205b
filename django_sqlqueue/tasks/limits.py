"""Fleet-wide limits of tasks: ``task_options(max_running=…, rate=…, concurrency_key=…)``.

The limits travel in the task's message: ``enqueue`` formats the concurrency key from the
task's arguments (``"account:{account_id}"`` → ``"account:7"``) and writes
``{"key", "max_running", "rate"}`` into the payload, so a worker knows a task's claims
without importing it. With a key, the limits hold per key value, shared by every task
naming the same value; without one, they hold for the task (all its runs).
"""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..consuming.limits import Claim, Rate, check_max_running, parse_rate

if TYPE_CHECKING:
    from ..consuming.message import Message

KEY_SCOPE = "tasks"  # the scope of every concurrency key, so tasks share a key's limits


def check_limits(func: Callable[..., Any], max_running: Any, rate: Any,
                 concurrency_key: Any) -> dict[str, Any] | None:
    """The limits ``task_options()`` got, checked against ``func``'s parameters: the
    template's fields must name them. Raises ValueError naming the problem."""
    check_max_running(max_running)
    if rate is not None:
        parse_rate(rate)
    if concurrency_key is None:
        if max_running is None and rate is None:
            return None
        return {"max_running": max_running, "rate": rate, "concurrency_key": None}
    if not isinstance(concurrency_key, str) or not concurrency_key:
        raise ValueError(f"concurrency_key must be a non-empty string like 'account:{{account_id}}', "
                         f"got {concurrency_key!r}")
    if max_running is None and rate is None:
        raise ValueError("concurrency_key needs max_running or rate: it names what they limit")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(concurrency_key) if f is not None]
    except ValueError as exc:
        raise ValueError(f"concurrency_key {concurrency_key!r} is not a format string: {exc}") from exc
    parameters = inspect.signature(func).parameters
    for name in fields:
        base = name.split(".")[0].split("[")[0]
        if base not in parameters:
            raise ValueError(f"concurrency_key {concurrency_key!r} names {{{name}}}, but "
                             f"{getattr(func, '__qualname__', func)} has no parameter {base!r}")
    return {"max_running": max_running, "rate": rate, "concurrency_key": concurrency_key}


def payload_limits(func: Callable[..., Any], declared: dict[str, Any] | None, args: list[Any],
                   kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """What the task's message carries of its limits (None: it has none)."""
    if declared is None:
        return None
    key = ""
    template = declared["concurrency_key"]
    if template is not None:
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        key = template.format(**bound.arguments)
    return {"key": key, "max_running": declared["max_running"], "rate": declared["rate"]}


class TaskLimits:
    """The claims of a task queue's messages, read from their payloads."""

    def claims(self, message: Message) -> tuple[Claim, ...]:
        payload = message.payload
        limits = payload.get("limits") if isinstance(payload, dict) else None
        if not isinstance(limits, dict):
            return ()
        try:
            running = check_max_running(limits.get("max_running"))
            rate = _rate(limits.get("rate"))
        except ValueError:
            return ()  # not written by enqueue: no limits rather than a stuck task
        if running is None and rate is None:
            return ()
        key = str(limits.get("key") or "")
        scope = KEY_SCOPE if key else f"task:{payload.get('task', '')}"
        return (Claim(scope, key, running, rate),)


@functools.lru_cache(maxsize=256)
def _rate(text: str | None) -> Rate | None:
    return None if text is None else parse_rate(text)
