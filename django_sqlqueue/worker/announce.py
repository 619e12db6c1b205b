"""Django signals for what the worker did, sent after the change committed.

The signals for handler outcomes are sent by the outcomes themselves (``outcomes.py``).
"""

from __future__ import annotations

from .. import signals
from ..consuming.message import Message
from ..consuming.registry import Subscription


def delivered(message: Message, subscription: Subscription) -> None:
    signals.message_delivered.send(sender=Message, message=message, subscription=subscription)


def dead_lettered(message: Message, subscription: Subscription, error: str) -> None:
    signals.message_dead_lettered.send(sender=Message, message=message,
                                       subscription=subscription, error=error)
