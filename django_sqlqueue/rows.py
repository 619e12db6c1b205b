"""Turning log rows into the objects users see: one path for StoredMessage and Message."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .models.messages import MessageRow


def epoch_ms_to_datetime(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, tz=UTC)


def decode_json(value: Any) -> Any:
    """Backends return JSON columns as text or already decoded; normalise to Python objects."""
    if isinstance(value, str | bytes | bytearray):
        return json.loads(value)
    return value


def common_fields(row: MessageRow) -> dict[str, Any]:
    """The fields a published message and a delivered one share, decoded."""
    return {
        "topic": row.topic, "key": row.key, "id": row.id,
        "payload": decode_json(row.payload), "headers": decode_json(row.metadata) or {},
        "published_at": epoch_ms_to_datetime(row.published_at),
    }
