"""Which partitions run together after a poll cycle failed (``worker.isolation``).

No database here: the worker tests show the same with real workers and real failures.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def narrow_down(fails: Callable[[frozenset[int]], bool], doom_fails: bool = False,
                contention: bool = False, polls: int = 40) -> tuple[list[int], int, bool]:
    """Polls of one partition whose cycles hand out messages 0..99: a cycle fails when
    ``fails(the messages it touched)``. Returns the messages dead-lettered, the failed
    cycles and whether the partition was released."""
    partitions, isolation = held(1), Isolation()
    everything = frozenset(range(100))
    doomed: list[int] = []
    failures, now = 0, 0.0
    for _ in range(polls):
        for batch in isolation.batches(partitions, now):
            if not batch.partitions:
                continue
            narrowing = batch.narrowing
            # A dead-lettered message is gone from later cycles.
            touched = (everything if narrowing is None else narrowing.offsets) - set(doomed)
            if narrowing is not None and narrowing.doom is not None and not doom_fails:
                doomed += sorted(narrowing.offsets)
                isolation.succeeded(batch)
            elif fails(touched):
                failures += 1
                if isolation.failed(batch, contention, now, touched, "Boom: refused"):
                    return doomed, failures, True
            else:
                isolation.succeeded(batch)
        now += LONGEST_PAUSE
    return doomed, failures, False


def test_a_message_failing_every_cycle_it_is_in_is_found_in_halves_and_dead_lettered():
    doomed, failures, released = narrow_down(lambda touched: 37 in touched)

    assert (doomed, released) == ([37], False)
    # The whole partition, halves down to the message, then the message alone.
    assert failures <= 1 + math.ceil(math.log2(100)) + RELEASE_AFTER


def test_the_dead_letter_names_the_error_and_the_failures_alone():
    partitions, isolation = held(1), Isolation()
    batch = isolation.batches(partitions, 0)[0]
    isolation.failed(batch, False, 0, [5], "Boom: refused")
    for n in range(RELEASE_AFTER):
        [_, batch] = isolation.batches(partitions, 100.0 * (n + 1))
        assert batch.narrowing.doom is None
        isolation.failed(batch, False, 100.0 * (n + 1), [5], "Boom: refused")
    [_, batch] = isolation.batches(partitions, 1000.0)

    assert batch.narrowing.offsets == {5}
    assert batch.narrowing.doom == (f"its poll cycle failed {RELEASE_AFTER} times with only "
                                    "this message in it: Boom: refused")


def test_two_poison_messages_are_both_found():
    doomed, _, released = narrow_down(lambda touched: bool({3, 90} & touched))

    assert (sorted(doomed), released) == ([3, 90], False)


def test_lock_waits_never_dead_letter_a_message():
    doomed, _, released = narrow_down(lambda touched: 37 in touched, contention=True)

    assert (doomed, released) == ([], False)


def test_a_fault_that_also_fails_the_dead_lettering_releases_the_partition_instead():
    doomed, _, released = narrow_down(lambda touched: True, doom_fails=True)

    assert (doomed, released) == ([], True)
