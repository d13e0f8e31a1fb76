from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from homeai.scheduling import clock as clock_module
from homeai.scheduling.clock import Clock, MonotonicClock, VirtualClock


def test_virtual_clock_moves_only_forward_when_told() -> None:
    clock = VirtualClock(5.0)
    assert clock.now() == 5.0 and clock.advance(0.25) == 5.25
    clock.set(6.0)
    assert clock.now() == 6.0
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    with pytest.raises(ValueError):
        clock.set(5.0)


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(MonotonicClock(), Clock) and isinstance(VirtualClock(), Clock)
    assert not isinstance(object(), Clock)


def test_real_clock_reads_time_monotonic(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.monotonic and nothing else: wall time (time.time) jumps with NTP and would corrupt delays."""
    readings = iter([100.0, 100.5])
    monkeypatch.setattr(clock_module, "time", SimpleNamespace(monotonic=lambda: next(readings), time=time.time))
    real = MonotonicClock()
    assert real.now() == 100.0 and real.now() == 100.5


def test_real_clock_advances_with_real_time() -> None:
    real = MonotonicClock()
    start = real.now()
    time.sleep(0.02)  # sleep waits at least this long, so the clock must show it
    assert real.now() - start >= 0.019
