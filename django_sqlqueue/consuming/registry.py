"""@subscriber and the registry of subscriptions, filled by importing apps' ``queues.py``."""

from __future__ import annotations

import functools
import inspect
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.apps import apps
from django.utils.module_loading import module_has_submodule

from ..conf import MAX_SECONDS, get_settings, is_seconds
from ..exceptions import ConfigurationError
from ..models.fields import GROUP_LENGTH
from ..publishing import validate_topic
from .backoff import Backoff, ExponentialBackoff
from .limits import MessageLimits, subscription_limits

if TYPE_CHECKING:
    from .message import Message

Handler = Callable[["Message"], object]
H = TypeVar("H", bound=Handler)
_GROUP_RE = re.compile(r"[A-Za-z0-9._-]+")  # the whole name: use fullmatch
logger = logging.getLogger("django_sqlqueue.worker")


class RecordedOutcome(Protocol):
    """What hooks see of a handler's outcome being recorded (its kind is its class)."""

    @property
    def message(self) -> Message: ...


class SubscriptionHooks(Protocol):
    def handed_out(self, messages: list[Message], using: str) -> None:
        """``messages`` are being delivered (their handlers start after the commit)."""

    def recorded(self, outcomes: Sequence[RecordedOutcome], using: str) -> None:
        """The handlers' ``outcomes`` (acks, retries, dead letters) are being recorded."""

    def started(self, stopping: threading.Event, stop: Callable[[], None], using: str) -> None:
        """The worker started; it sets ``stopping`` when it stops, and ``stop()`` stops it."""


@dataclass(frozen=True)
class Subscription:
    """One (topic, consumer group) pair and how its handler is run."""

    topic: str
    group: str
    handler: Handler  # what the worker calls: the decorated function, its result checked
    max_attempts: int
    visibility_timeout: float
    batch_size: int
    backoff: Backoff
    auto_extend: bool
    # The priority of a message, from its payload: the worker starts the highest-priority
    # due message among the partitions it holds, reading ahead of its free capacity to
    # find it. None: every message has priority 0 and is handed out in log order.
    priority_of: Callable[[Any], int] | None = None
    # Called by the worker inside its poll transaction, so what they write commits with
    # the deliveries and outcomes (the Tasks backend keeps its results this way).
    hooks: SubscriptionHooks | None = None
    # Fleet-wide limits (max_running, rate, per key): the claims each message needs before
    # it starts (see django_sqlqueue.worker.limits). None: no limits.
    limits: MessageLimits | None = None

    @property
    def strict(self) -> bool:
        """batch_size=1: one message in flight per key, strictly in log order."""
        return self.batch_size == 1

    @property
    def function(self) -> Handler:
        """The decorated function, as written."""
        return getattr(self.handler, "__wrapped__", self.handler)

    @property
    def name(self) -> str:
        return _name_of(self.function)


_registry: dict[tuple[str, str], Subscription] = {}


def subscriber(
    topic: str,
    *,
    group: str,
    max_attempts: int | None = None,
    visibility_timeout: float | None = None,
    batch_size: int | None = None,
    backoff: Backoff | None = None,
    auto_extend: bool = True,
    max_running: int | None = None,
    rate: str | None = None,
    max_running_per_key: int | None = None,
    rate_per_key: str | None = None,
) -> Callable[[H], H]:
    """Register the decorated function as ``group``'s handler for ``topic``.

    Returning acks the message; raising nacks it (``Retry`` sets the delay, ``DeadLetter``
    gives up at once). Unset options come from ``SQLQUEUE``. ``auto_extend`` keeps a
    running handler's message invisible past ``visibility_timeout``. ``max_running`` and
    ``rate`` (``"100/s"``, ``"6000/m"``) limit the group's handlers of this topic across
    every worker; ``max_running_per_key`` and ``rate_per_key`` do so per message key.
    """
    try:
        validate_topic(topic)
    except ValueError as exc:
        raise ConfigurationError(f"@subscriber: {exc}") from exc
    if not isinstance(group, str) or not group or len(group) > GROUP_LENGTH \
            or not _GROUP_RE.fullmatch(group) or group.startswith("__"):
        raise ConfigurationError(
            f"@subscriber: group must be 1-{GROUP_LENGTH} characters from [A-Za-z0-9._-] "
            f"not starting with '__', got {group!r}"
        )
    conf = get_settings()
    max_attempts = conf.max_attempts if max_attempts is None else max_attempts
    visibility_timeout = conf.visibility_timeout if visibility_timeout is None else visibility_timeout
    batch_size = conf.batch_size if batch_size is None else batch_size
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
        raise ConfigurationError(f"@subscriber: max_attempts must be an int >= 1, got {max_attempts!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigurationError(f"@subscriber: batch_size must be an int >= 1, got {batch_size!r}")
    if not is_seconds(visibility_timeout):
        raise ConfigurationError(
            f"@subscriber: visibility_timeout must be seconds > 0, at most {MAX_SECONDS:.0f} "
            f"(a year), got {visibility_timeout!r}"
        )
    if backoff is not None and not callable(getattr(backoff, "delay", None)):
        raise ConfigurationError("@subscriber: backoff must have a delay(attempt) method")
    try:
        limits = subscription_limits(group, topic, max_running=max_running, rate=rate,
                                     max_running_per_key=max_running_per_key,
                                     rate_per_key=rate_per_key)
    except ValueError as exc:
        raise ConfigurationError(f"@subscriber: {exc}") from exc

    def register(handler: H) -> H:
        if not callable(handler):
            raise ConfigurationError(f"@subscriber must decorate a callable, got {handler!r}")
        if inspect.iscoroutinefunction(handler):
            raise ConfigurationError(
                f"@subscriber: {_name_of(handler)} is an async function; handlers are plain "
                "functions, run in the worker's threads and never awaited"
            )
        existing = _registry.get((topic, group))
        if existing is not None and existing.name != _name_of(handler):
            raise ConfigurationError(
                f"@subscriber: group {group!r} already has a handler for topic {topic!r} "
                f"({existing.name}); a group has one handler per topic"
            )
        _registry[(topic, group)] = Subscription(
            topic=topic, group=group, handler=_checking_result(handler, topic, group),
            max_attempts=max_attempts,
            visibility_timeout=float(visibility_timeout), batch_size=batch_size,
            backoff=backoff or ExponentialBackoff(), auto_extend=auto_extend, limits=limits,
        )
        return handler

    return register


def _name_of(handler: Handler) -> str:
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"


def _checking_result(function: Handler, topic: str, group: str) -> Handler:
    """``function`` as the worker runs it: returning acks, whatever is returned.

    A returned value is ignored, with a warning the first time each subscription returns
    one (a handler that returns False to say "failed" would otherwise be acked silently;
    raising is how a handler fails). A returned awaitable is an error, though: the work it
    stands for never ran, so the message must not be acked.
    """
    warned = False

    @functools.wraps(function)
    def handler(message: Message) -> None:
        nonlocal warned
        result = function(message)
        if result is None:
            return
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if callable(close):
                close()  # a coroutine that never ran would warn when it is collected
            raise TypeError(
                f"{_name_of(function)} returned {type(result).__name__}, which is never "
                "awaited: handlers must do their work before they return"
            )
        if not warned:
            warned = True
            logger.warning(
                "handler returned a value, which is ignored: the message is acked; raise to "
                "fail it (logged once per subscription) topic=%s group=%s handler=%s type=%s",
                topic, group, _name_of(function), type(result).__name__,
            )

    return handler


def autodiscover() -> None:
    """Import every installed app's ``queues`` module (like admin.autodiscover).

    Raises ConfigurationError naming the module that failed to import.
    """
    for app_config in apps.get_app_configs():
        if not module_has_submodule(app_config.module, "queues"):
            continue
        name = f"{app_config.name}.queues"
        try:
            import_module(name)
        except Exception as exc:
            raise ConfigurationError(
                f"could not import {name}: {type(exc).__name__}: {exc}"
            ) from exc


def subscriptions() -> list[Subscription]:
    return sorted(_registry.values(), key=lambda s: (s.topic, s.group))


def unregister(topic: str, group: str) -> None:
    """Forget a subscription (tests)."""
    _registry.pop((topic, group), None)
