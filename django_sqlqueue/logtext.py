"""Text from handlers and publishers made safe for one log line.

Keys and error texts come from users' data. Written into a log as they are, a line break
in one would start a line that looks like the worker's own (a forged ``lease lost``, say),
and terminal control sequences would reach whoever tails the log.
"""

from __future__ import annotations

LIMIT = 500  # characters of one value in a log line


def loggable(value: object, limit: int = LIMIT) -> str:
    """``value`` as text with line breaks and other unprintable characters escaped
    (``\\n``, ``\\x1b``), cut to ``limit`` characters."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit] + "…"
