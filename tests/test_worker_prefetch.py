"""How many messages a worker keeps in flight: the floor always, more only while its
handlers are quick enough to finish it within QUEUE_SECONDS, never past the ceiling."""

from __future__ import annotations

from django_sqlqueue.worker.prefetch import CEILING_FACTOR, QUEUE_SECONDS, Prefetch


def settled(prefetch: Prefetch, seconds: float, runs: int = 500) -> int:
    for _ in range(runs):
        prefetch.ran(seconds)
    return prefetch.cap


def test_a_worker_starts_at_the_floor():
    assert Prefetch(4).cap == 100
    assert Prefetch(30).cap == 300


def test_quick_handlers_raise_the_cap_up_to_the_ceiling():
    prefetch = Prefetch(4)
    assert settled(prefetch, 0.0001) == 100 * CEILING_FACTOR
    # 4 threads, 10 ms each: what they finish in QUEUE_SECONDS.
    assert settled(prefetch, 0.01) == int(4 * QUEUE_SECONDS / 0.01)


def test_slow_handlers_bring_the_cap_back_to_the_floor():
    prefetch = Prefetch(4)
    settled(prefetch, 0.0001)
    assert settled(prefetch, 2.0) == 100
    assert settled(Prefetch(1), 0.0) == 500  # instant handlers: the ceiling, not a crash
