"""Cron ticks in a schedule's time zone, across DST changes, and what a late worker fires."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_sqlqueue.scheduling import cron

PARIS = cron.zone("Europe/Paris")


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def ticks_between(expression: str, tz, start: str, end: str) -> list[str]:  # type: ignore[no-untyped-def]
    found, tick = [], ms(start)
    while (tick := cron.next_tick(expression, tz, tick)) < ms(end):
        found.append(datetime.fromtimestamp(tick / 1000, tz).isoformat())
    return found


def test_a_job_in_the_hour_spring_forward_skips_runs_once_when_the_clock_resumes():
    # 2026-03-29: Paris goes from 02:00 to 03:00.
    assert ticks_between("30 2 * * *", PARIS, "2026-03-28T00:00:00+00:00",
                         "2026-03-31T00:00:00+00:00") == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]


def test_a_job_in_the_hour_autumn_repeats_runs_once_the_first_time():
    # 2026-10-25: Paris goes from 03:00 back to 02:00.
    assert ticks_between("30 2 * * *", PARIS, "2026-10-24T00:00:00+00:00",
                         "2026-10-27T00:00:00+00:00") == [
        "2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]


def test_an_hourly_job_runs_every_real_hour_through_the_autumn_change():
    ticks = ticks_between("@hourly", PARIS, "2026-10-24T23:30:00+00:00",
                          "2026-10-25T03:30:00+00:00")
    assert ticks == ["2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00",
                     "2026-10-25T03:00:00+01:00", "2026-10-25T04:00:00+01:00"]


def test_a_late_worker_fires_once_for_a_missed_dst_day_with_every_policy():
    tz, first = PARIS, ms("2026-03-29T00:30:00+00:00")  # before the skipped 02:30
    now = ms("2026-03-29T01:00:30+00:00")  # 03:00:30 local, just after the fixed-up tick
    for policy in cron.CATCH_UP_POLICIES:
        ticks, following = cron.due_ticks("30 2 * * *", tz, first, now, policy)
        assert ticks == [ms("2026-03-29T01:00:00+00:00")], policy
        assert following == ms("2026-03-30T00:30:00+00:00")


def test_the_default_policy_fires_the_latest_missed_tick_only():
    ticks, following = cron.due_ticks("0 * * * *", UTC, ms("2026-01-01T00:00:00+00:00"),
                                      ms("2026-01-03T10:20:00+00:00"), "latest")
    assert ticks == [ms("2026-01-03T10:00:00+00:00")]
    assert following == ms("2026-01-03T11:00:00+00:00")


def test_all_fires_every_missed_tick_in_order():
    ticks, _ = cron.due_ticks("0 * * * *", UTC, ms("2026-01-01T00:00:00+00:00"),
                              ms("2026-01-01T05:30:00+00:00"), "all")
    assert ticks == [ms(f"2026-01-01T0{h}:00:00+00:00") for h in range(6)]


def test_all_is_bounded_to_the_newest_ticks():
    ticks, following = cron.due_ticks("* * * * *", UTC, ms("2025-01-01T00:00:00+00:00"),
                                      ms("2026-01-01T00:00:30+00:00"), "all")
    assert len(ticks) == cron.CATCH_UP_LIMIT
    assert ticks[-1] == ms("2026-01-01T00:00:00+00:00")
    assert ticks == sorted(ticks)
    assert following == ms("2026-01-01T00:01:00+00:00")


def test_none_skips_missed_ticks_but_fires_one_just_due():
    first = ms("2026-01-01T00:00:00+00:00")
    later = first + 2 * 3_600_000 + 5 * 60_000  # 02:05: the 00:00 to 02:00 ticks were missed
    assert cron.due_ticks("0 * * * *", UTC, first, later, "none") == ([], first + 3 * 3_600_000)
    assert cron.due_ticks("0 * * * *", UTC, first, first + 900, "none") == (
        [first], first + 3_600_000)


def test_a_tick_exactly_now_is_due():
    now = ms("2026-01-01T00:00:00+00:00")
    assert cron.due_ticks("0 * * * *", UTC, now, now, "latest")[0] == [now]


def test_seconds_may_come_first_in_a_sixth_field():
    start = ms("2026-01-01T00:00:00+00:00")
    assert cron.next_tick("*/5 * * * * *", UTC, start) == start + 5000


@pytest.mark.parametrize("alias,fields", sorted(cron.ALIASES.items()))
def test_aliases_stand_for_their_five_fields(alias, fields):
    start = ms("2026-05-05T05:05:05+00:00")
    assert cron.next_tick(alias, UTC, start) == cron.next_tick(fields, UTC, start)


@pytest.mark.parametrize("bad", ["", "* * *", "@often", "61 * * * *", "0 0 31 2 *",
                                 "* * * * * * *", None])
def test_bad_cron_is_refused(bad):
    with pytest.raises(cron.InvalidCron):
        cron.validate(bad)  # type: ignore[arg-type]


def test_an_unknown_time_zone_is_refused():
    with pytest.raises(cron.InvalidCron, match="Mars/Olympus"):
        cron.zone("Mars/Olympus")


def test_the_tick_label_is_utc_to_the_second():
    assert cron.tick_label(ms("2026-03-29T03:00:00+02:00")) == "2026-03-29T01:00:00Z"
