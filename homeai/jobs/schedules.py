"""Schedules as people write them, turned into APScheduler triggers.

    "0 7 * * *"            cron (minute hour day month weekday), in the server's local time
    "every 15m", "6h"      an interval (s, m, h, d)
    "2025-06-01T03:00"     once, at that time (ISO 8601; local time unless it names an offset)
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

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
    if len(value.split()) == 5:
        try:
            return CronTrigger.from_crontab(value)
        except ValueError as e:
            raise ValueError(f"not a valid cron expression: {e}") from e
    raise ValueError("expected a cron expression ('0 7 * * *'), an interval ('every 15m') or an ISO time")
