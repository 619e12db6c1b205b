"""The signals of a committed poll cycle, sent once it committed and its deliveries went
to the handler threads: a slow or failing receiver delays no handler and stops nothing."""

from __future__ import annotations

import logging
from typing import Any

from .. import signals
from ..consuming.message import Message
from ..logtext import loggable
from .results import CycleResult

logger = logging.getLogger("django_sqlqueue.worker")


def send_cycle_signals(result: CycleResult) -> None:
    """``message_acked``/``nacked``/``dead_lettered`` for the outcomes ``result`` recorded,
    ``message_dead_lettered`` for messages dead on fetch, ``message_delivered`` for its
    deliveries."""
    for report in result.reports.values():
        subscription = report.partition.subscription
        for outcome in report.recorded:
            if outcome.signal:
                send_signal(outcome.signal, outcome.message, subscription=subscription,
                      **outcome.signal_arguments())
        for dead in report.dead_on_fetch:
            send_signal("message_dead_lettered", dead.message, subscription=subscription,
                  error=dead.error)
        for delivery in report.deliveries:
            send_signal("message_delivered", delivery.message, subscription=subscription)


def send_signal(name: str, message: Message, **arguments: Any) -> None:
    """Send the signal ``name`` of :mod:`django_sqlqueue.signals`. Receivers are the
    project's code: one that raises must not keep a message from its handler, nor stop
    the worker, so each is called, its failure logged, and the others still run."""
    signal = getattr(signals, name)
    for receiver, result in signal.send_robust(sender=Message, message=message, **arguments):
        if isinstance(result, Exception):
            logger.error(
                "signal receiver failed signal=%s receiver=%s topic=%s offset=%s error=%s: %s",
                name, getattr(receiver, "__qualname__", repr(receiver)), message.topic,
                message.offset, type(result).__name__, loggable(result, 300),
            )
