"""Clocks: the scheduler asks a clock for the time, so tests and the simulator can run on virtual time."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Monotonic time in seconds. Only differences matter; the origin is arbitrary."""

    def now(self) -> float: ...


class MonotonicClock:
    """Wall-clock time for the real server (time.monotonic: immune to NTP jumps)."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class VirtualClock:
    """Time that moves only when told to: deterministic tests and the cost-model simulator."""

    __slots__ = ("_t",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._t = float(start_s)

    def now(self) -> float:
        return self._t

    def advance(self, dt_s: float) -> float:
        """Move forward by ``dt_s`` seconds (never backwards); returns the new time."""
        if dt_s < 0:
            raise ValueError(f"a monotonic clock cannot go back (dt={dt_s})")
        self._t += dt_s
        return self._t

    def set(self, t_s: float) -> None:
        """Jump to ``t_s``, which must not be earlier than now."""
        if t_s < self._t:
            raise ValueError(f"a monotonic clock cannot go back ({t_s} < {self._t})")
        self._t = float(t_s)
