"""The fleet-wide limits a task queue's message claims, read from its payload by the same
check that dead-letters a malformed one (:mod:`.payload`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..consuming.limits import Claim
from .payload import InvalidTaskPayload, parse

if TYPE_CHECKING:
    from ..consuming.message import Message


class TaskLimits:
    """The claims of a task queue's messages, read from their payloads. ``backends`` maps
    each queue the worker runs to its backend's alias (see :func:`parse`)."""

    def __init__(self, backends: Mapping[str, str] | None = None) -> None:
        self.backends = backends

    def claims(self, message: Message) -> tuple[Claim, ...]:
        try:
            claim = parse(message.payload, message.topic, self.backends).claim
        except InvalidTaskPayload:
            return ()  # it claims nothing: the task runner dead-letters it with the reason
        return () if claim is None else (claim,)
