"""A partition's window in memory: one :class:`Entry` per unacked message, and its size.

A partition's *window* is the stretch of the log between the group's watermark (every
message at or below it acked) and the read cursor (every message at or below it read
into the window). The owner keeps each unacked message of the window in memory as an
:class:`Entry`; everything else in the window is acked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..conf import get_settings
from ..models.delivery import NEVER_DELIVERED, DeliveryRow

# Unacked messages a partition keeps in its window by default (SQLQUEUE["MAX_WINDOW"]): in
# flight, due, or waiting briefly. Waiting messages beyond half of it are parked, so a
# mass of delayed messages or a stuck key never fills it; when it is full (in-flight
# messages and due ones read ahead) the partition reads no further until some are
# consumed. Other partitions are not affected.
MAX_WINDOW = 10_000
# A message that will not be due for longer than this is parked instead of kept in memory.
PARK_AFTER_MS = 1_000
# parked_next when the partition has no parked message due ever (epoch ms).
NEVER_MS = 2**62

State = Literal["in_flight", "waiting", "blocked"]


@dataclass
class Entry:
    """An unacked message of the window."""

    offset: int
    position: int
    key: str  # '' for a keyless message
    attempts: int  # deliveries so far (0: never delivered)
    state: State
    due_ms: int  # waiting: deliverable from; in flight: invisible until (epoch ms, DB clock)
    last_error: str = ""
    priority: int = 0  # a task's priority; 0 for messages of @subscriber handlers
    parked: bool = False  # read back from a parked row: the watermark does not wait for it
    # The sequence number of its one live timer (see Partition._schedule): a heap item
    # carrying another number is stale.
    timer: int = 0


@dataclass
class Admitted:
    """What reading one message into the window decided for it."""

    entry: Entry | None  # None: already acked
    deliver: bool = False  # hand it out now
    hold_until: int | None = None  # write a row keeping it invisible until then



def max_window() -> int:
    """Unacked messages a partition keeps in memory (SQLQUEUE["MAX_WINDOW"])."""
    return get_settings().max_window


def attempts_of(delivery: DeliveryRow | None) -> int:
    """Deliveries so far of a message with this delivery row (0: never delivered)."""
    if delivery is None or delivery.retry_count == NEVER_DELIVERED:
        return 0
    return delivery.retry_count + 1
