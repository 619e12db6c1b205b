"""Django signals for what the worker did, sent after the change committed.

Receivers are the project's code: one that raises must not keep a message from its
handler, nor stop the worker. Every signal goes through :func:`send`, which calls each
receiver, logs the failures, and carries on.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from .. import signals
from ..consuming.message import Message
from ..consuming.registry import Subscription
from ..logtext import loggable

logger = logging.getLogger("django_sqlqueue.worker")


def send(signal: Signal, name: str, message: Message, **kwargs: Any) -> None:
    for receiver, result in signal.send_robust(sender=Message, message=message, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "signal receiver failed signal=%s receiver=%s topic=%s offset=%s error=%s: %s",
                name, getattr(receiver, "__qualname__", repr(receiver)), message.topic,
                message.offset, type(result).__name__, loggable(result, 300),
            )


def delivered(message: Message, subscription: Subscription) -> None:
    send(signals.message_delivered, "message_delivered", message, subscription=subscription)


def acked(message: Message, subscription: Subscription) -> None:
    send(signals.message_acked, "message_acked", message, subscription=subscription)


def nacked(message: Message, subscription: Subscription, delay: float, error: str) -> None:
    send(signals.message_nacked, "message_nacked", message, subscription=subscription,
         delay=delay, error=error)


def dead_lettered(message: Message, subscription: Subscription, error: str) -> None:
    send(signals.message_dead_lettered, "message_dead_lettered", message,
         subscription=subscription, error=error)
