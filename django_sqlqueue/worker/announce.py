"""Django signals for what the worker did, sent after the change committed."""

from __future__ import annotations

from .. import signals
from ..consuming.message import Message
from ..consuming.registry import Subscription
from .partitions import Outcome


def delivered(message: Message, subscription: Subscription) -> None:
    signals.message_delivered.send(sender=Message, message=message, subscription=subscription)


def dead_lettered(message: Message, subscription: Subscription, error: str) -> None:
    signals.message_dead_lettered.send(sender=Message, message=message,
                                       subscription=subscription, error=error)


def outcome(recorded: Outcome) -> None:
    subscription = recorded.partition.subscription
    if recorded.kind == "ack":
        signals.message_acked.send(sender=Message, message=recorded.message,
                                   subscription=subscription)
    elif recorded.kind == "nack":
        signals.message_nacked.send(sender=Message, message=recorded.message,
                                    subscription=subscription, delay=recorded.delay,
                                    error=recorded.error)
    else:
        dead_lettered(recorded.message, subscription, recorded.error)
