from __future__ import annotations

import pytest

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
    real = MonotonicClock()
    assert isinstance(real, Clock) and isinstance(VirtualClock(), Clock)
    assert real.now() <= real.now()
