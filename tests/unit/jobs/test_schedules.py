"""Schedules: cron, intervals, one time; anything else is a ValueError that says what is expected. Cron's
weekdays count from Sunday = 0 (or 7): APScheduler's count from Monday = 0, so "0 7 * * 1-5" ran Tuesday to
Saturday and "* * * * 0" on Mondays until the field was translated."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from homeai.jobs.schedules import parse_schedule


def test_forms() -> None:
    assert isinstance(parse_schedule("0 7 * * *"), CronTrigger)
    assert isinstance(parse_schedule("*/15 * * * mon-fri"), CronTrigger)
    every = parse_schedule("every 15m")
    assert isinstance(every, IntervalTrigger) and every.interval.total_seconds() == 900
    assert parse_schedule("2h").interval.total_seconds() == 7200  # type: ignore[attr-defined]
    assert parse_schedule("1d").interval.total_seconds() == 86400  # type: ignore[attr-defined]
    assert isinstance(parse_schedule("2030-06-01T03:00"), DateTrigger)


@pytest.mark.parametrize("text", ["", "sometimes", "0 7 * *", "61 7 * * *", "every 0s", "2030-13-01T00:00",
                                  "2001-01-01T00:00", "99999999999999999999999d", "0 0 31 2 *"])
def test_bad_schedules(text: str) -> None:
    with pytest.raises(ValueError):
        parse_schedule(text)


WEEK = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def fire_days(text: str) -> list[str]:
    """The weekdays the schedule fires on, over two weeks from a Saturday (local time)."""
    trigger, t = parse_schedule(text), datetime(2026, 12, 5, 12).astimezone()
    days = []
    for _ in range(14):
        t = trigger.get_next_fire_time(None, t + timedelta(seconds=1))
        days.append(t.strftime("%a"))
    return sorted(set(days), key=WEEK.index)


@pytest.mark.parametrize(("weekday", "days"), [
    ("1-5", ["Mon", "Tue", "Wed", "Thu", "Fri"]), ("mon-fri", ["Mon", "Tue", "Wed", "Thu", "Fri"]),
    ("0", ["Sun"]), ("7", ["Sun"]), ("6", ["Sat"]), ("0,6", ["Sat", "Sun"]), ("5-7", ["Fri", "Sat", "Sun"]),
    ("fri-sun", ["Fri", "Sat", "Sun"]), ("*/2", ["Tue", "Thu", "Sat", "Sun"]), ("1", ["Mon"])])
def test_cron_weekdays_count_from_sunday(weekday: str, days: list[str]) -> None:
    assert fire_days(f"0 7 * * {weekday}") == days


@pytest.mark.parametrize("weekday", ["mon#1", "L", "mon-fri-sat", "6-1", "8", "1/0"])
def test_weekday_forms_cron_does_not_have_are_refused_not_read_in_part(weekday: str) -> None:
    with pytest.raises(ValueError, match="weekday"):
        parse_schedule(f"0 7 * * {weekday}")


def test_a_cron_schedule_fires_once_per_wall_clock_time_when_the_clock_goes_back() -> None:
    """When daylight saving time ends, "30 1 * * *" fired at 01:30 summer time and again at 01:30 winter time
    (a digest sent twice); cron runs it once."""
    from zoneinfo import ZoneInfo

    from homeai.jobs.schedules import WallClockCron

    tz = ZoneInfo("America/New_York")

    def fires(expr: str) -> list[str]:
        trigger = WallClockCron.from_crontab(expr, timezone=tz)
        t, out = trigger.get_next_fire_time(None, datetime(2026, 11, 1, 4, tzinfo=UTC)), []
        while t is not None and t < datetime(2026, 11, 2, 4, tzinfo=tz):
            out.append(t.strftime("%d %H:%M%z"))
            t = trigger.get_next_fire_time(t, t.astimezone(UTC))
        return out

    assert fires("30 1 * * *") == ["01 01:30-0400", "02 01:30-0500"]
    assert fires("*/30 1 * * *") == ["01 01:00-0400", "01 01:30-0400", "02 01:00-0500", "02 01:30-0500"]
    assert fires("0 7 * * *") == ["01 07:00-0500"]
    assert isinstance(parse_schedule("30 1 * * *"), WallClockCron)
