"""Schedules: cron, intervals, one time; anything else is a ValueError that says what is expected."""

from __future__ import annotations

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
