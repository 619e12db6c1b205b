"""Every error the package raises derives from :class:`SQLQueueError`."""

from __future__ import annotations


class SQLQueueError(Exception):
    """Base class for django-sqlqueue errors."""


class InvalidMessage(SQLQueueError, ValueError):
    """A message given to publish() or publish_many() was rejected; nothing was written."""


class ConfigurationError(SQLQueueError, ValueError):
    """A subscriber or worker was configured with a value that cannot work."""


class LeaseLost(SQLQueueError):
    """This worker no longer owns the partition; another worker took it over."""


class Retry(SQLQueueError):  # noqa: N818 - raised by handlers as a verb
    """Raise from a handler to retry the message after ``delay`` seconds."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and delay < 0:
            raise ValueError(f"Retry delay must be >= 0 seconds, got {delay!r}")
        super().__init__(reason or "retry requested")
        self.delay = delay
        self.reason = reason


class DeadLetter(SQLQueueError):  # noqa: N818 - raised by handlers as a verb
    """Raise from a handler to move the message to the dead-letter topic at once."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "dead-lettered by handler")
        self.reason = reason
