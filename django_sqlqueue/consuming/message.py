"""The message a handler receives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..conf import MAX_SECONDS, is_seconds

if TYPE_CHECKING:
    from ..models.messages import MessageRow


@dataclass(frozen=True)
class DeadLetterInfo:
    """Why and from where a message of a dead-letter topic was moved there."""

    group: str  # the consumer group that gave up on it
    original_topic: str
    original_offset: int
    original_id: str  # the id it was published with ('' for copies made before 0.4)
    error: str  # the last error of its handler
    attempts: int  # deliveries it had before it was moved


@dataclass
class Message:
    """One delivery of a message to a consumer group's handler.

    ``attempt`` is 1 on the first delivery. Handlers must be idempotent: delivery is
    at-least-once, so the same message can arrive again (after a crash, a timeout, ...).
    """

    topic: str
    key: str
    id: str
    offset: int
    payload: Any
    headers: dict[str, str]
    published_at: datetime
    attempt: int
    group: str = ""
    position: int = 0
    partition: str = ""  # the partition of its topic the key maps to
    # Set on messages of a dead-letter topic: the failure that moved it there.
    dead_letter: DeadLetterInfo | None = None
    _extend: Callable[[float], None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: MessageRow, group: str, attempt: int, partition: str) -> Message:
        from ..replays import ORIGINAL_ID_HEADER, replay_target
        from ..rows import common_fields

        fields = common_fields(row)
        if replay_target(fields["headers"]) is not None and fields["headers"].get(ORIGINAL_ID_HEADER):
            # A replayed dead letter is the same message again: its handler sees the id it
            # was published with (idempotency keys stay valid), not the replay's own.
            fields["id"] = fields["headers"][ORIGINAL_ID_HEADER]
        return cls(offset=row.offset, position=row.position or 0, attempt=attempt, group=group,
                   partition=partition, **fields)

    def extend_visibility(self, seconds: float) -> None:
        """Keep this message invisible to other deliveries for ``seconds`` more, from now.

        For long work: it does not count as a retry. Raises LeaseLost if the worker no
        longer owns the partition.
        """
        if not is_seconds(seconds):
            raise ValueError(f"extend_visibility needs a number of seconds > 0, at most "
                             f"{MAX_SECONDS:.0f} (a year), got {seconds!r}")
        if self._extend is None:
            raise RuntimeError("this Message was not delivered by a worker")
        self._extend(float(seconds))
