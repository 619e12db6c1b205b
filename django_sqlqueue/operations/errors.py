"""What the operations refuse, as typed errors (the CLI turns each into one line, exit 2)."""

from __future__ import annotations

from ..exceptions import SQLQueueError


class OperationError(SQLQueueError, ValueError):
    """An operation was given something it cannot act on."""


class UnknownSubscription(OperationError):
    """No consumer group of that name is registered for that topic."""


class UnknownSubscriber(OperationError):
    """No worker of that name holds a lease or has a heartbeat."""


class UnknownMessage(OperationError):
    """No message with that offset in that topic (or it is not sequenced yet)."""


class AmbiguousMessage(OperationError):
    """The id names messages of the topic under several keys (ids are unique per key)."""


class AlreadyHandled(OperationError):
    """The group has acked (or dead-lettered) that message already."""


class InvalidFilter(OperationError):
    """A dead-letter filter value is out of range or malformed."""
