"""Whether a poll needs a cycle at all, so that an idle worker runs none.

A partition needs a cycle when new messages arrived in it, a handler reported, a timer
it set (a retry, a delayed message, a visibility timeout) is due, its window has to be
rebuilt, or a running handler's message needs its visibility extended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .partitions import Partition


def note_heads(partitions: dict[tuple[str, str, str], Partition],
               heads: Iterable[tuple[str, str, int]], groups: dict[str, set[str]]) -> None:
    """Record the newest position of each partition that got messages, for the held ones.

    ``heads`` is (topic, partition, highest new position); ``groups`` the groups this
    worker runs per topic.
    """
    for topic, number, position in heads:
        for group in groups.get(topic, ()):
            partition = partitions.get((group, topic, number))
            if partition is not None and (partition.head is None or position > partition.head):
                partition.head = position


def extension_due(partitions: Iterable[Partition], now_ms: int,
                  is_running: Callable[[tuple[str, str, str], int], bool]) -> bool:
    """Whether a running handler's message has used half its visibility timeout."""
    return any(p.due_for_extension(now_ms, is_running) for p in partitions)


def cycle_wanted(partitions: Iterable[Partition], now_ms: int) -> bool:
    return any(p.wants_look(now_ms) for p in partitions)
