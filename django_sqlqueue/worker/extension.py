"""``Message.extend_visibility``: a handler pushing back its own message's timeout."""

from __future__ import annotations

import queue
from collections.abc import Callable

from django.db import connections

from ..consuming.message import Message
from ..exceptions import LeaseLost, SQLQueueError
from ..models import DeliveryState
from .clock import DatabaseClock
from .partitions import Ident, Partition

# (partition, offset, invisible until): extensions made by handler threads, for the main
# thread to fold into the partition's state (only the main thread touches that state).
Extensions = queue.SimpleQueue[tuple[Ident, int, int]]


def extender(partition: Partition, generation: int, message: Message, worker_name: str,
             token: str, clock: DatabaseClock, using: str,
             notices: Extensions) -> Callable[[float], None]:
    """The extension function for one delivery: a single UPDATE that checks the lease
    generation itself (the handler runs outside the worker's fenced poll transaction).

    Inside the handler's own ``transaction.atomic`` the UPDATE runs on a connection of its
    own and commits at once. On the handler's connection it would lock the delivery row
    until the handler's transaction ends, and the worker, which extends and acks that row
    in its poll transaction, would wait for it with every other partition.
    """

    def extend(seconds: float) -> None:
        until = clock.now_ms() + int(seconds * 1000)
        refs = [partition.ref(message.offset)]
        fence = (worker_name, token, generation)
        own = connections[using]
        if not own.in_atomic_block:
            updated = DeliveryState.objects.extend(partition.group, partition.topic, refs,
                                                   until, using, fence=fence)
        elif own.vendor == "sqlite":
            raise SQLQueueError(
                "cannot extend visibility inside transaction.atomic on SQLite: SQLite has "
                "one writer at a time and this transaction is it; call extend_visibility() "
                "before the atomic block or after it"
            )
        else:
            separate = connections.create_connection(using)
            try:
                updated = DeliveryState.objects.extend(
                    partition.group, partition.topic, refs, until, using, fence=fence,
                    connection=separate,
                )
            finally:
                separate.close()
        if not updated:
            raise LeaseLost(
                f"cannot extend offset {message.offset}: partition {partition.number!r} of "
                f"{partition.topic!r} is no longer leased to {worker_name}"
            )
        notices.put((partition.ident, message.offset, until))

    return extend
