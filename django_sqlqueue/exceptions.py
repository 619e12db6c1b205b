"""Every error the package raises derives from :class:`SQLQueueError`."""

from __future__ import annotations

import math

from django.core.exceptions import ImproperlyConfigured


class SQLQueueError(Exception):
    """Base class for django-sqlqueue errors."""


class InvalidMessage(SQLQueueError, ValueError):
    """A message given to publish() or publish_many() was rejected; nothing was written."""


class UndecodableMessage(SQLQueueError, ValueError):
    """A stored message's payload or headers cannot be decoded: nested deeper than
    MAX_PAYLOAD_DEPTH (written by another release, or straight into the table) or not
    JSON. The worker dead-letters such a message with this error as its reason."""


class ConfigurationError(SQLQueueError, ImproperlyConfigured, ValueError):
    """A subscriber or worker was configured with a value that cannot work."""


class LeaseLost(SQLQueueError):
    """This worker no longer owns the partition; another worker took it over."""


class Retry(SQLQueueError):  # noqa: N818 - raised by handlers as a verb
    """Raise from a handler to retry the message after ``delay`` seconds."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and (
            not isinstance(delay, int | float) or isinstance(delay, bool)
            or not math.isfinite(delay) or delay < 0
        ):
            raise ValueError(f"Retry delay must be a finite number of seconds >= 0, got {delay!r}")
        super().__init__(reason or "retry requested")
        self.delay = delay
        self.reason = reason


class DeadLetter(SQLQueueError):  # noqa: N818 - raised by handlers as a verb
    """Raise from a handler to move the message to the dead-letter topic at once."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "dead-lettered by handler")
        self.reason = reason


class Cancelled(SQLQueueError):  # noqa: N818 - the error a cancelled task's result shows
    """A task was cancelled before it started (its result reads FAILED with this error)."""


class TopicNotDrained(SQLQueueError):
    """repartition() refused: sequenced messages of the topic are not consumed yet.

    ``unconsumed`` maps each registered consumer group that is behind to how many of the
    topic's messages it has not acked; ``unclaimed`` counts the messages waiting while no
    group has registered for the topic at all.
    """

    def __init__(self, topic: str, unconsumed: dict[str, int], unclaimed: int = 0) -> None:
        if unconsumed:
            behind = ", ".join(f"group {group!r} has {count} unconsumed message(s)"
                               for group, count in sorted(unconsumed.items()))
            todo = "let those groups' workers consume the topic"
        else:
            behind = (f"{unclaimed} message(s) wait for a consumer and no consumer group has "
                      f"registered for the topic")
            todo = "run its consumers' workers until they have consumed them"
        super().__init__(
            f"topic {topic!r} is not drained: {behind}; changing its partition count now would "
            f"break per-key order. Pause its publishers, {todo}, then repartition again"
        )
        self.topic = topic
        self.unconsumed = dict(unconsumed)
        self.unclaimed = unclaimed

    def __reduce__(self) -> tuple[type[TopicNotDrained], tuple[str, dict[str, int], int]]:
        return type(self), (self.topic, self.unconsumed, self.unclaimed)
