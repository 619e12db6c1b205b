"""Turning log rows into the objects users see: one path for StoredMessage and Message."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .encoding import depth_error, too_deep
from .exceptions import UndecodableMessage
from .models.messages import MessageRow


def epoch_ms_to_datetime(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, tz=UTC)


def decode_json(value: Any, what: str = "payload") -> Any:
    """Backends return JSON columns as text or already decoded; normalise to Python objects.

    Raises UndecodableMessage for text nested deeper than MAX_PAYLOAD_DEPTH, measured
    before decoding: Python's decoder recurses, and a RecursionError deep in a worker's
    poll cycle would fail the cycle every time.
    """
    if isinstance(value, str | bytes | bytearray):
        depth = too_deep(value)
        if depth is not None:
            raise UndecodableMessage(depth_error(f"{what} is", depth))
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise UndecodableMessage(f"{what} is not valid JSON: {exc}") from exc
    return value


def common_fields(row: MessageRow) -> dict[str, Any]:
    """The fields a published message and a delivered one share, decoded."""
    return {
        "topic": row.topic, "key": row.key, "id": row.id,
        "payload": decode_json(row.payload), "headers": decode_json(row.metadata, "headers") or {},
        "published_at": epoch_ms_to_datetime(row.published_at),
    }
