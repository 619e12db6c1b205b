"""Which partitions a poll must look at, so that an idle worker looks at none.

A partition needs a look when new messages arrived in it, a handler reported, a timer it
set (a retry, a delayed message) is due, or, once per sweep, while it still has unacked
messages the worker is waiting out (in flight elsewhere, backing off, not yet due).
"""

from __future__ import annotations

from collections.abc import Iterable

from .partitions import Partition


def note_new_messages(
    partitions: Iterable[Partition], new: Iterable[tuple[str, str, int | None]]
) -> dict[str, list[str]]:
    """Flag held partitions that got messages; return the keys no held partition covers,
    per topic (new partitions, or ones held by other workers).

    ``new`` is (topic, key, earliest future deliver_at or None) per partition with news.
    """
    index: dict[tuple[str, str], list[Partition]] = {}
    for partition in partitions:
        index.setdefault((partition.topic, partition.key), []).append(partition)
    unknown: dict[str, list[str]] = {}
    for topic, key, future_due in new:
        held = index.get((topic, key))
        if not held:
            unknown.setdefault(topic, []).append(key)
            continue
        for partition in held:
            partition.needs_look = True
            partition.settled = False
            if future_due is not None:
                partition.add_timer(future_due)
    return unknown


def to_look_at(partitions: Iterable[Partition], now_ms: int, sweep: bool) -> list[Partition]:
    looked = []
    for partition in partitions:
        if partition.timer_ms is not None and partition.timer_ms <= now_ms:
            partition.timer_ms = None
            partition.needs_look = True
        if sweep and (not partition.settled or partition.in_flight):
            partition.needs_look = True
        if partition.needs_look:
            looked.append(partition)
    return looked


def extension_due(partitions: Iterable[Partition], now_ms: int) -> bool:
    """Whether a running handler's message has used half its visibility timeout."""
    for partition in partitions:
        if not partition.subscription.auto_extend:
            continue
        half = int(partition.subscription.visibility_timeout * 500)
        if any(f.invisible_until - now_ms < half for f in partition.in_flight.values()):
            return True
    return False
