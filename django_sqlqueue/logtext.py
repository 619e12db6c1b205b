"""Text from handlers and publishers made safe for one log line.

Keys and error texts come from users' data. Written into a log as they are, a line break
in one would start a line that looks like the worker's own (a forged ``lease lost``, say),
and terminal control sequences would reach whoever tails the log.
"""

from __future__ import annotations

from collections.abc import Iterable

LIMIT = 500  # characters of one value in a log line


def loggable(value: object, limit: int = LIMIT) -> str:
    """``value`` as text with line breaks and other unprintable characters escaped
    (``\\n``, ``\\x1b``), cut to ``limit`` characters."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit] + "…"


def number_ranges(numbers: Iterable[object]) -> str:
    """Partition numbers as sorted runs, numerically: ``0-3,7,10-11``."""
    ordered = sorted({int(str(n)) for n in numbers})
    runs: list[str] = []
    start = previous = None
    for n in [*ordered, None]:
        if n is not None and previous is not None and n == previous + 1:
            previous = n
            continue
        if start is not None:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = n
    return ",".join(runs)
