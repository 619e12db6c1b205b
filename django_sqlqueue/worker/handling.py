"""Running one delivery's handler and turning what it did into an outcome.

The dispatcher does this on its handler threads; ``django_sqlqueue.testing.drain`` does it
in the test's own thread, so both decide acks, retries and dead letters alike.
"""

from __future__ import annotations

import logging

from ..conf import get_settings
from ..consuming.backoff import retry_delay
from ..consuming.message import Message
from ..exceptions import DeadLetter, Retry
from ..logtext import loggable
from ..models.fields import storable_error
from .outcomes import Acked, DeadLettered, Outcome, Retried
from .partitions import Partition

logger = logging.getLogger("django_sqlqueue.worker")


def handle(partition: Partition, generation: int, message: Message) -> Outcome:
    """Call the subscription's handler with ``message``; return its outcome. Returning
    acks; ``Retry`` sets the delay; ``DeadLetter`` gives up at once; anything else raised
    is a failure, retried after the backoff until the attempts run out."""
    subscription = partition.subscription
    try:
        subscription.handler(message)
    except Retry as exc:
        delay = retry_delay(subscription.backoff, message.attempt, exc.delay)
        return failed(partition, generation, message, f"Retry: {exc}", delay)
    except DeadLetter as exc:
        return DeadLettered(partition, generation, message,
                            error=storable_error(f"DeadLetter: {exc}"))
    except BaseException as exc:  # noqa: BLE001 - any handler failure is a nack, never a crash
        delay = retry_delay(subscription.backoff, message.attempt)
        return failed(partition, generation, message, f"{type(exc).__name__}: {exc}", delay)
    return Acked(partition, generation, message)


def failed(partition: Partition, generation: int, message: Message, error: str,
           delay: float) -> Outcome:
    """A failed attempt: retried after ``delay`` seconds, or dead-lettered when it was
    the subscription's last."""
    subscription = partition.subscription
    error = storable_error(error)
    if message.attempt >= subscription.max_attempts:
        logger.warning(
            "handler failed, giving up: dead-lettered to dead_letter_topic=%s topic=%s "
            "group=%s key=%s offset=%s attempt=%s error=%s",
            message.topic + get_settings().dlq_suffix, message.topic, message.group,
            loggable(message.key), message.offset, message.attempt, loggable(error),
        )
        return DeadLettered(partition, generation, message, error=error)
    logger.info(
        "handler failed, retrying in %.2fs topic=%s group=%s key=%s offset=%s attempt=%s "
        "error=%s", delay, message.topic, message.group, loggable(message.key),
        message.offset, message.attempt, loggable(error),
    )
    return Retried(partition, generation, message, error=error, delay=delay)
