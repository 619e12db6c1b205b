"""The ``SQLQUEUE`` settings dict, read lazily so ``override_settings`` works.

Every key has a documented default; :mod:`django_sqlqueue.checks` reports bad values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # How long an idle worker waits between polls, in seconds.
    "POLL_INTERVAL": 0.1,
    # Messages fetched per partition per poll; 1 means strictly ordered processing.
    "BATCH_SIZE": 10,
    # How long a delivered message stays invisible before it is redelivered, in seconds.
    "VISIBILITY_TIMEOUT": 30.0,
    # Deliveries before a failing message moves to the dead-letter topic.
    "MAX_ATTEMPTS": 5,
    # A lease not renewed for this long may be taken by another worker, in seconds.
    "LEASE_DURATION": 30.0,
    # How often a worker renews leases, heartbeats and rebalances, in seconds.
    "RENEW_INTERVAL": 10.0,
    # Appended to a topic to name its dead-letter topic.
    "DLQ_SUFFIX": "_dlq",
    # Largest accepted payload, as serialized JSON, in bytes.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Rows per multi-row INSERT in publish_many.
    "PUBLISH_BATCH_SIZE": 500,
    # How often a worker deletes fully consumed messages, in seconds (0 disables GC).
    "GC_INTERVAL": 60.0,
    # Seconds a stopping worker waits for in-flight handlers before giving up on them.
    "SHUTDOWN_GRACE": 30.0,
}


@dataclass(frozen=True)
class QueueSettings:
    poll_interval: float
    batch_size: int
    visibility_timeout: float
    max_attempts: int
    lease_duration: float
    renew_interval: float
    dlq_suffix: str
    max_payload_bytes: int
    publish_batch_size: int
    gc_interval: float
    shutdown_grace: float


def raw_settings() -> dict[str, Any]:
    """The user's ``SQLQUEUE`` dict merged over the defaults, unvalidated."""
    user = getattr(settings, "SQLQUEUE", None) or {}
    return {**DEFAULTS, **(user if isinstance(user, dict) else {})}


def get_settings() -> QueueSettings:
    """The current settings; call it each time rather than caching the result."""
    values = raw_settings()
    return QueueSettings(**{name.lower(): values[name] for name in DEFAULTS})
