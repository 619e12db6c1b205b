"""Declaring fleet-wide limits: what ``@subscriber`` accepts, and the refusals at decoration."""

from __future__ import annotations

import pytest

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.limits import parse_rate


@pytest.mark.parametrize("options, problem", [
    ({"max_running": 0}, "max_running must be an int >= 1"),
    ({"max_running": True}, "max_running must be an int >= 1"),
    ({"max_running_per_key": -1}, "max_running_per_key must be an int >= 1"),
    ({"rate": "abc"}, "rate must look like '100/s'"),
    ({"rate": "0/s"}, "rate must allow at least one start"),
    ({"rate": "5/0s"}, "rate must allow at least one start"),
    ({"rate": 100}, "rate must be a string"),
    ({"rate_per_key": "10/fortnight"}, "rate_per_key must look like"),
])
def test_bad_limits_are_refused_when_decorating(options, problem):
    with pytest.raises(ValueError, match=problem):
        sqlqueue.subscriber("bad-limits", group="limits", **options)


@pytest.mark.parametrize("text, count, period", [
    ("100/s", 100, 1.0), ("6000/m", 6000, 60.0), ("10/h", 10, 3600.0), ("1/d", 1, 86400.0),
    ("5/10s", 5, 10.0), (" 7 / min ", 7, 60.0),
])
def test_rates_are_a_count_per_period(text, count, period):
    rate = parse_rate(text)
    assert (rate.count, rate.period) == (count, period)
