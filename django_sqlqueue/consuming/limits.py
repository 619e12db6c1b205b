"""Fleet-wide limits: how many handlers of a scope may run at once, and how often they start.

A subscription (``@subscriber(max_running=…, rate=…, max_running_per_key=…,
rate_per_key=…)``) or a task (``task_options(max_running=…, rate=…,
concurrency_key=…)``) declares its limits; for each message the worker asks for the
*claims* it must hold to start it: a slot of a scope (``max_running``) and a token of
the scope's bucket (``rate``). The worker's side lives in :mod:`django_sqlqueue.worker.limits`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .message import Message

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
_RATE_RE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*")


@dataclass(frozen=True)
class Rate:
    """``count`` starts per ``period`` seconds, with a burst of at most ``count``."""

    count: int
    period: float  # seconds
    text: str

    @property
    def per_ms(self) -> float:
        """Tokens added to the bucket per millisecond."""
        return self.count / (self.period * 1000.0)

    def __str__(self) -> str:
        return self.text


def parse_rate(value: Any, name: str = "rate") -> Rate:
    """``"100/s"``, ``"6000/m"``, ``"10/h"``, ``"1/d"`` or ``"5/10s"`` as a :class:`Rate`.

    Raises ValueError naming what is wrong.
    """
    if isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string like '100/s' or '6000/m', got {value!r}")
    match = _RATE_RE.fullmatch(value.lower())
    if match is None or match.group(3) not in _UNITS:
        raise ValueError(f"{name} must look like '100/s', '6000/m', '10/h' or '5/10s' (a count, "
                         f"a slash, an optional number and a unit s, m, h or d), got {value!r}")
    count = int(match.group(1))
    times = int(match.group(2) or 1)
    if count < 1 or times < 1:
        raise ValueError(f"{name} must allow at least one start per period, got {value!r}")
    return Rate(count, times * _UNITS[match.group(3)], value.strip())


def check_max_running(value: Any, name: str = "max_running") -> int | None:
    """``value`` if it is None or an int >= 1; else ValueError naming the problem."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 (or None for no limit), got {value!r}")
    return value


@dataclass(frozen=True)
class Claim:
    """What starting one message needs of one scope: a slot (when ``max_running`` is set)
    and a token (when ``rate`` is set). ``key`` is '' for the scope as a whole."""

    scope: str
    key: str
    max_running: int | None
    rate: Rate | None


class MessageLimits(Protocol):
    """What a subscription's limits ask of each message before it starts."""

    def claims(self, message: Message) -> tuple[Claim, ...]: ...


@dataclass(frozen=True)
class SubscriptionLimits:
    """Limits declared on ``@subscriber``: over the whole subscription, and per message key
    (keyless messages are each their own key, so per-key limits pass them)."""

    scope: str
    max_running: int | None = None
    rate: Rate | None = None
    max_running_per_key: int | None = None
    rate_per_key: Rate | None = None

    def claims(self, message: Message) -> tuple[Claim, ...]:
        claims: list[Claim] = []
        if self.max_running is not None or self.rate is not None:
            claims.append(Claim(self.scope, "", self.max_running, self.rate))
        if message.key and (self.max_running_per_key is not None or self.rate_per_key is not None):
            claims.append(Claim(self.scope, message.key, self.max_running_per_key,
                                self.rate_per_key))
        return tuple(claims)

    def describe(self) -> dict[str, Any]:
        return {"max_running": self.max_running, "rate": None if self.rate is None else str(self.rate),
                "max_running_per_key": self.max_running_per_key,
                "rate_per_key": None if self.rate_per_key is None else str(self.rate_per_key)}


def subscription_limits(group: str, topic: str, *, max_running: Any = None, rate: Any = None,
                        max_running_per_key: Any = None,
                        rate_per_key: Any = None) -> SubscriptionLimits | None:
    """The limits of ``@subscriber``'s arguments (None: it has none). Raises ValueError."""
    running = check_max_running(max_running)
    per_key = check_max_running(max_running_per_key, "max_running_per_key")
    parsed = None if rate is None else parse_rate(rate)
    parsed_per_key = None if rate_per_key is None else parse_rate(rate_per_key, "rate_per_key")
    if running is None and per_key is None and parsed is None and parsed_per_key is None:
        return None
    return SubscriptionLimits(f"{group}:{topic}", running, parsed, per_key,
                              parsed_per_key)
