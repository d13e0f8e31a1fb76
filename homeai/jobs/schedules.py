"""Schedules as people write them, turned into APScheduler triggers.

    "0 7 * * *"            cron (minute hour day month weekday), in the server's local time
    "every 15m", "6h"      an interval (s, m, h, d)
    "2025-06-01T03:00"     once, at that time (ISO 8601; local time unless it names an offset)
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # cron's numbering: 0 (and 7) is Sunday
_WEEKDAY_ITEM = re.compile(r"(\*|[0-7]|[a-z]{3})(?:-([0-7]|[a-z]{3}))?(?:/(\d+))?")
_INTERVAL = re.compile(r"^(?:every\s+)?(\d+(?:\.\d+)?)\s*(s|m|h|d)$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_INTERVAL_S = 1.0


def parse_schedule(text: str) -> BaseTrigger:
    """A trigger for ``text``; ValueError says what is wrong with it."""
    try:
        trigger = _parse(text.strip())
        if trigger.get_next_fire_time(None, datetime.now(UTC)) is None:
            raise ValueError("it never fires")
        return trigger
    except ValueError:
        raise
    except (OverflowError, TypeError, LookupError) as e:  # a number too large for a date, say
        raise ValueError(f"out of range: {e}") from None


def one_time(text: str) -> datetime | None:
    """The time of a one-time schedule (aware: local unless it names an offset); None for other forms."""
    value = text.strip()
    if not re.match(r"^\d{4}-\d{2}-\d{2}", value):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.astimezone()


def cron_weekdays(field: str) -> str:
    """Cron's weekday field (numbers with 0 or 7 for Sunday, or names; lists, ranges, steps) as the day names
    APScheduler takes: its CronTrigger counts from 0 = Monday, so "1-5" given as is ran Tuesday to Saturday.
    Anything else ("mon#1", "L", "mon-fri-sat") is refused, never read as part of it."""
    if field == "*":
        return field
    days: set[int] = set()
    for item in field.lower().split(","):
        match = _WEEKDAY_ITEM.fullmatch(item)
        if match is None:
            raise ValueError(f"weekday {item!r}: expected 0-7 or sun..sat, a range a-b, a step /n, or a list")
        first, last, step = match.groups()
        if first == "*":
            if last is not None:
                raise ValueError(f"weekday {item!r}: a range cannot start with *")
            lo, hi = 0, 6
        else:
            lo = _day(first)
            hi = _day(last, end=True) if last is not None else (6 if step else lo)
        if hi < lo or (step is not None and int(step) < 1):
            raise ValueError(f"weekday {item!r}: an empty range")
        days |= {d % 7 for d in range(lo, hi + 1, int(step or 1))}
    return ",".join(_DAYS[d] for d in sorted(days))


def _day(token: str, end: bool = False) -> int:
    """A weekday as cron numbers it; Sunday ends a range as 7 ("fri-sun" is Friday to Sunday)."""
    if token.isdigit():
        return int(token)
    if token not in _DAYS:
        raise ValueError(f"weekday {token!r}: expected 0-7 or sun..sat")
    number = _DAYS.index(token)
    return 7 if end and number == 0 else number


class WallClockCron(CronTrigger):
    """A cron schedule that fires once per wall-clock time: when daylight saving time ends and the clock goes
    back an hour, the times it shows again ("30 1 * * *": 01:30 summer time, then 01:30 winter time) do not
    fire it again (a digest sent twice, a retention run twice). Pickled into the job store as APScheduler's own."""

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        nxt = super().get_next_fire_time(previous_fire_time, now)
        if previous_fire_time is None:
            return nxt
        shown, at = previous_fire_time.replace(tzinfo=None), previous_fire_time.timestamp()
        # (aware times of one zone compare by wall clock: the instants tell a repeated time from the same one)
        while nxt is not None and nxt.replace(tzinfo=None) <= shown and nxt.timestamp() > at:
            nxt = super().get_next_fire_time(nxt, nxt.astimezone(UTC) + timedelta(seconds=1))
        return nxt


def _parse(value: str) -> BaseTrigger:
    match = _INTERVAL.match(value)
    if match:
        seconds = float(match.group(1)) * _UNIT_S[match.group(2).lower()]
        if seconds < MIN_INTERVAL_S:
            raise ValueError(f"an interval must be at least {MIN_INTERVAL_S:g} s")
        return IntervalTrigger(seconds=seconds)
    if re.match(r"^\d{4}-\d{2}-\d{2}", value):
        try:
            trigger = DateTrigger(run_date=datetime.fromisoformat(value))
        except ValueError as e:
            raise ValueError(f"not an ISO 8601 time: {e}") from e
        if trigger.run_date < datetime.now(UTC):
            raise ValueError(f"{value} is in the past")
        return trigger
    fields = value.split()
    if len(fields) == 5:
        try:
            fields[4] = cron_weekdays(fields[4])
            return WallClockCron.from_crontab(" ".join(fields))
        except ValueError as e:
            raise ValueError(f"not a valid cron expression: {e}") from e
    raise ValueError("expected a cron expression ('0 7 * * *'), an interval ('every 15m') or an ISO time")
