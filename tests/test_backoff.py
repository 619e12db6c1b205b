"""ExponentialBackoff: how long a failed message waits before its next attempt."""

from __future__ import annotations

import pytest

import django_sqlqueue as sqlqueue


def test_without_jitter_the_delay_doubles_per_attempt_up_to_the_cap():
    backoff = sqlqueue.ExponentialBackoff(base=1, cap=30, jitter=False)

    assert [backoff.delay(attempt) for attempt in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_the_base_scales_every_delay():
    backoff = sqlqueue.ExponentialBackoff(base=0.25, cap=10, jitter=False)

    assert [backoff.delay(attempt) for attempt in range(1, 5)] == [0.25, 0.5, 1.0, 2.0]


def test_a_cap_equal_to_the_base_makes_a_constant_delay():
    backoff = sqlqueue.ExponentialBackoff(base=3, cap=3, jitter=False)

    assert {backoff.delay(attempt) for attempt in range(1, 10)} == {3.0}


def test_huge_attempt_numbers_stay_at_the_cap():
    backoff = sqlqueue.ExponentialBackoff(base=1, cap=300, jitter=False)

    assert backoff.delay(10_000) == 300
    assert sqlqueue.ExponentialBackoff(base=1, cap=300).delay(10_000) <= 300


def test_with_jitter_each_delay_lies_between_half_and_all_of_its_ceiling():
    backoff = sqlqueue.ExponentialBackoff(base=1, cap=30)
    ceilings = [1, 2, 4, 8, 16, 30, 30]

    for attempt, ceiling in enumerate(ceilings, start=1):
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempt, min(delays), max(delays))
        # Jitter spreads the delays rather than returning one value.
        assert len(set(delays)) > 1


def test_the_defaults_are_one_second_base_five_minute_cap_with_jitter():
    backoff = sqlqueue.ExponentialBackoff()

    assert (backoff.base, backoff.cap, backoff.jitter) == (1.0, 300.0, True)
    assert "base=1.0" in repr(backoff) and "cap=300.0" in repr(backoff)


@pytest.mark.parametrize(
    ("base", "cap", "names"),
    [(0, 10, "base"), (-1, 10, "base"), (2, 1, "cap"), (1, 0, "cap")],
)
def test_invalid_base_or_cap_raise_value_error(base, cap, names):
    with pytest.raises(ValueError, match=names):
        sqlqueue.ExponentialBackoff(base=base, cap=cap)
