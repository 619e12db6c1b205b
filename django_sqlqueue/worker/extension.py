"""``Message.extend_visibility``: a handler pushing back its own message's timeout."""

from __future__ import annotations

import queue
from collections.abc import Callable

from ..consuming.message import Message
from ..exceptions import LeaseLost
from ..models import DeliveryState
from .clock import DatabaseClock
from .partitions import Ident, Partition

# (partition, offset, invisible until): extensions made by handler threads, for the main
# thread to fold into the partition's state (only the main thread touches that state).
Extensions = queue.SimpleQueue[tuple[Ident, int, int]]


def extender(partition: Partition, generation: int, message: Message, worker_name: str,
             clock: DatabaseClock, using: str, notices: Extensions) -> Callable[[float], None]:
    """The extension function for one delivery: a single UPDATE on the handler thread's
    own connection that checks the lease generation itself (the handler runs outside the
    worker's fenced poll transaction)."""

    def extend(seconds: float) -> None:
        until = clock.now_ms() + int(seconds * 1000)
        updated = DeliveryState.objects.extend(
            partition.group, partition.topic, [partition.ref(message.offset)], until,
            using, fence=(worker_name, generation),
        )
        if not updated:
            raise LeaseLost(
                f"cannot extend offset {message.offset}: partition {partition.number!r} of "
                f"{partition.topic!r} is no longer leased to {worker_name}"
            )
        notices.put((partition.ident, message.offset, until))

    return extend
