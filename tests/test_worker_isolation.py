"""Which partitions run together after a poll cycle failed (``worker.isolation``).

No database here: the worker tests show the same with real workers and real failures.
"""

from __future__ import annotations

from django_sqlqueue.consuming.backoff import ExponentialBackoff
from django_sqlqueue.consuming.registry import Subscription
from django_sqlqueue.worker.isolation import LONGEST_PAUSE, RELEASE_AFTER, Isolation
from django_sqlqueue.worker.partitions import Ident, Partition

SUBSCRIPTION = Subscription(
    topic="t", group="g", handler=lambda message: None, max_attempts=3,
    visibility_timeout=30.0, batch_size=10, backoff=ExponentialBackoff(), auto_extend=True,
)


def held(count: int) -> dict[Ident, Partition]:
    partitions = [Partition(SUBSCRIPTION, str(n), generation=1) for n in range(count)]
    return {p.ident: p for p in partitions}


def numbers(batch_partitions: dict[Ident, Partition]) -> list[str]:
    return sorted(p.number for p in batch_partitions.values())


def run_once(isolation: Isolation, partitions: dict[Ident, Partition], failing: str,
             now: float, contention: bool = False) -> list[list[str]]:
    """One poll: every batch due runs; those holding ``failing`` fail. Returns the
    batches run and whether ``failing`` was released."""
    ran = []
    for batch in isolation.batches(partitions, now):
        if not batch.partitions:
            continue
        ran.append(numbers(batch.partitions))
        if any(p.number == failing for p in batch.partitions.values()):
            if isolation.failed(batch, contention, now):
                del partitions[next(iter(batch.partitions))]
        else:
            isolation.succeeded(batch)
    return ran


def test_a_failing_partition_is_narrowed_down_while_the_others_run_together():
    partitions, isolation = held(8), Isolation()
    assert run_once(isolation, partitions, "5", now=0) == [[str(n) for n in range(8)]]
    assert run_once(isolation, partitions, "5", now=0) == [["0", "1", "2", "3"],
                                                          ["4", "5", "6", "7"]]
    assert run_once(isolation, partitions, "5", now=0) == [["0", "1", "2", "3"], ["4", "5"],
                                                          ["6", "7"]]
    assert run_once(isolation, partitions, "5", now=0) == [["0", "1", "2", "3", "6", "7"],
                                                          ["4"], ["5"]]
    # Alone now: it pauses, and the others run together as one batch again.
    assert run_once(isolation, partitions, "5", now=0) == [["0", "1", "2", "3", "4", "6", "7"]]
    assert isolation.suspected() == 1


def test_a_partition_failing_alone_is_released_unless_it_waits_for_a_lock():
    for contention, released in ((False, True), (True, False)):
        partitions, isolation = held(1), Isolation()
        now = 0.0
        for _ in range(RELEASE_AFTER + 3):
            run_once(isolation, partitions, "0", now=now, contention=contention)
            now += LONGEST_PAUSE
        assert (("g", "t", "0") not in partitions) is released


def test_a_suspect_that_succeeds_rejoins_the_others():
    partitions, isolation = held(4), Isolation()
    run_once(isolation, partitions, "1", now=0)
    run_once(isolation, partitions, "none", now=0)
    assert isolation.suspected() == 0
    assert run_once(isolation, partitions, "none", now=0) == [["0", "1", "2", "3"]]
