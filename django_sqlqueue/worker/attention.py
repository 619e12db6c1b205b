"""Whether a poll needs a cycle at all, so that an idle worker runs none.

A partition needs a cycle when new messages arrived in it, a handler reported, a timer
it set (a retry, a delayed message, a visibility timeout) is due, its window has to be
rebuilt, or a running handler's message needs its visibility extended. A worker in burst
mode stops once no partition has anything left to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .partitions import Partition


def extension_due(partitions: Iterable[Partition], now_ms: int,
                  is_running: Callable[[tuple[str, str, str], int], bool]) -> bool:
    """Whether a running handler's message has used half its visibility timeout."""
    return any(p.due_for_extension(now_ms, is_running) for p in partitions)


def cycle_wanted(partitions: Iterable[Partition], now_ms: int) -> bool:
    return any(p.wants_look(now_ms) for p in partitions)


def nothing_left(partitions: Iterable[Partition], now_ms: int) -> bool:
    """Whether no held partition has work of this run left (burst mode stops then)."""
    partitions = list(partitions)
    return (
        not any(p.in_flight_count() or p.wants_look(now_ms) for p in partitions)
        # A message that has run and waits out its retry backoff is still work of this
        # run; one not run yet and delayed (run_after, a publish delay) is not.
        and not any(e.attempts and e.state != "in_flight"
                    for p in partitions for e in p.entries.values())
    )
