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

from ..consuming.limits import Rate, check_max_running, parse_rate
from ..models.limit_buckets import RATE_LENGTH

if TYPE_CHECKING:
    pass

KEY_SCOPE = "tasks"  # the scope of every concurrency key, so tasks share a key's limits
# The largest max_running of a task. A worker makes a slot row per allowed handler, and a
# task's message carries the number: a worker refuses (dead-letters) a message asking for
# more, and enqueue refuses to write one.
MAX_TASK_RUNNING = 1000


def check_task_max_running(value: Any) -> int | None:
    """``value`` if it is None or an int from 1 to MAX_TASK_RUNNING; else ValueError."""
    running = check_max_running(value)
    if running is not None and running > MAX_TASK_RUNNING:
        raise ValueError(f"max_running of a task must be at most {MAX_TASK_RUNNING:,}, got {value!r}")
    return running


def check_task_rate(value: Any) -> Rate | None:
    """``value`` parsed (None: no rate); ValueError naming the problem."""
    if value is None:
        return None
    if not isinstance(value, str):  # _rate is cached: it takes hashable text only
        raise ValueError(f"rate must be a string like '100/s' or '6000/m', got {value!r}")
    if len(value) > RATE_LENGTH:
        raise ValueError(f"rate must be at most {RATE_LENGTH} characters, got {value!r}")
    return _rate(value)


def check_limits(func: Callable[..., Any], max_running: Any, rate: Any,
                 concurrency_key: Any) -> dict[str, Any] | None:
    """The limits ``task_options()`` got, checked against ``func``'s parameters: the
    template's fields must name them. Raises ValueError naming the problem."""
    check_task_max_running(max_running)
    check_task_rate(rate)
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


@functools.lru_cache(maxsize=256)
def _rate(text: str | None) -> Rate | None:
    return None if text is None else parse_rate(text)
