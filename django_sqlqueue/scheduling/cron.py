"""Cron expressions and the ticks they give, in a schedule's time zone.

Parsing and stepping are cronsim's (the scheduler of Healthchecks.io): a small, typed,
dependency-free library that follows Debian cron where time zones make cron ambiguous. A
job at a fixed time (its minute and hour fields are numbers) that falls in the hour a
spring-forward skips runs once, when the clock resumes; in the hour an autumn change
repeats, it runs once, the first time. Jobs with a wildcard hour or minute run by the
real clock: every real hour, however the wall clock moves.

Ticks are epoch milliseconds, like every time the queue stores.
"""

from __future__ import annotations

import zoneinfo
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime, tzinfo

from cronsim import CronSim, CronSimError

# The aliases cron itself understands, as the five fields they stand for.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
CATCH_UP_POLICIES = ("latest", "all", "none")
# Each field's name and highest value, in order (seconds only when six fields are given):
# a step above it ("*/61" in minutes) would silently act as the field's first value.
FIELD_BOUNDS = (("minute", 59), ("hour", 23), ("day-of-month", 31), ("month", 12),
                ("day-of-week", 7))
SECOND_BOUND = ("second", 59)
# "all" fires at most this many missed ticks, the newest ones, after a downtime.
CATCH_UP_LIMIT = 100
# A tick this late is missed: "none" skips it (a worker fires a tick within a second or so).
MISSED_AFTER_MS = 60_000


class InvalidCron(ValueError):
    """A cron expression or time zone that cannot be used."""


def expand(cron: str) -> str:
    """The fields of ``cron``, with an ``@alias`` replaced by what it stands for."""
    text = " ".join(cron.split())
    return ALIASES.get(text.lower(), text)


def zone(name: str) -> tzinfo:
    """The time zone named ``name`` (IANA, e.g. "Europe/Paris"); InvalidCron if unknown."""
    if name == "UTC":
        return UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidCron(f"unknown time zone {name!r}; use an IANA name such as "
                          "'Europe/Paris' or 'UTC'") from exc


def validate(cron: str) -> None:
    """InvalidCron unless ``cron`` is five cron fields (six with leading seconds) or an
    ``@alias``, with at least one tick in the next 50 years."""
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidCron(f"cron must be a non-empty string, got {cron!r}")
    fields = expand(cron).split()
    if fields[0].startswith("@"):
        raise InvalidCron(f"unknown cron alias {cron!r}; known: {', '.join(ALIASES)}")
    if len(fields) not in (5, 6):
        raise InvalidCron(f"cron {cron!r} has {len(fields)} fields; it needs five (minute hour "
                          "day-of-month month day-of-week), or six with seconds first")
    _validate_steps(cron, fields)
    try:
        next(CronSim(" ".join(fields), datetime.now(UTC)))
    except CronSimError as exc:
        raise InvalidCron(f"bad cron {cron!r}: {exc}") from exc
    except StopIteration as exc:
        raise InvalidCron(f"cron {cron!r} never fires") from exc


def _validate_steps(cron: str, fields: list[str]) -> None:
    bounds = ((SECOND_BOUND,) if len(fields) == 6 else ()) + FIELD_BOUNDS
    for field, (name, highest) in zip(fields, bounds, strict=True):
        for part in field.split(","):
            _, slash, step = part.partition("/")
            if slash and step.isdigit() and not 1 <= int(step) <= highest:
                raise InvalidCron(f"bad cron {cron!r}: step /{step} in the {name} field is "
                                  f"out of range (1-{highest})")


def next_tick(cron: str, tz: tzinfo, after_ms: int) -> int:
    """The first tick of ``cron`` strictly after ``after_ms``."""
    for tick in _forward(cron, tz, after_ms):
        return tick
    raise InvalidCron(f"cron {cron!r} never fires")


def due_ticks(cron: str, tz: tzinfo, first_ms: int, now_ms: int, policy: str
              ) -> tuple[list[int], int]:
    """What a schedule whose next tick was ``first_ms`` fires at ``now_ms``, and its next
    tick after that.

    Ticks from ``first_ms`` to ``now_ms`` are due. ``latest`` fires the newest one;
    ``all`` every one, at most CATCH_UP_LIMIT (the newest); ``none`` the newest only when it
    is less than MISSED_AFTER_MS late, so a schedule whose workers were down skips what it
    missed.
    """
    limit = CATCH_UP_LIMIT if policy == "all" else 1
    # Step back from now to the limit-th tick before it, then walk forward from there:
    # walking forward from first_ms would take a step per tick missed (a minute cron down
    # a year is half a million), and forward steps are the ones that place a tick in a
    # skipped hour as cron does.
    oldest = None
    back = _backward(cron, tz, now_ms)
    for _ in range(limit + 1):
        oldest = next(back, oldest)
    start = first_ms - 1 if oldest is None else max(first_ms - 1, min(oldest, now_ms) - 1000)
    fired: deque[int] = deque(maxlen=limit)
    following = None
    for tick in _forward(cron, tz, start):
        if tick > now_ms:
            following = tick
            break
        if tick >= first_ms:
            fired.append(tick)
    if following is None:  # pragma: no cover - validate() refuses crons that never fire
        raise InvalidCron(f"cron {cron!r} never fires")
    ticks = list(fired)
    if policy == "none":
        ticks = [t for t in ticks[-1:] if now_ms - t < MISSED_AFTER_MS]
    return ticks, following


def tick_label(tick_ms: int) -> str:
    """A tick as the message id shows it: UTC, to the second ("2026-03-29T01:00:00Z")."""
    return datetime.fromtimestamp(tick_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _forward(cron: str, tz: tzinfo, after_ms: int) -> Iterator[int]:
    """Ticks strictly after ``after_ms``, ascending (whole seconds)."""
    start = datetime.fromtimestamp(after_ms // 1000, tz)
    for when in CronSim(expand(cron), start):
        tick = int(when.astimezone(UTC).timestamp()) * 1000
        # A fixed-time job is stepped on the wall clock: started inside an hour that the
        # autumn change repeats, it may name a time already passed.
        if tick > after_ms:
            yield tick


def _backward(cron: str, tz: tzinfo, now_ms: int) -> Iterator[int]:
    """Ticks at or before ``now_ms``, descending."""
    # A microsecond past the second makes cronsim include that second itself.
    start = datetime.fromtimestamp(now_ms // 1000, tz).replace(microsecond=1)
    for when in CronSim(expand(cron), start, reverse=True):
        yield int(when.astimezone(UTC).timestamp()) * 1000
