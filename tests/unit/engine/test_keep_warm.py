"""The device loop keeps a CPU's cores warm for a while after work, then sleeps: on the real DeviceLoop, with
the keep-warm op and the monotonic clock replaced by fakes on one virtual timeline, so what is checked is
which slices run and when the loop gives up the CPU, not how long anything takes. Then the real op: it
returns, and it leaves the GIL to other threads while it runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from test_device_loop import Rig
from test_device_ownership import make_policy

from homeai.engine import device_loop
from homeai.runtime import kernels


class Timeline:
    """``time.monotonic`` for the device loop module, advanced by the fake keep-warm op."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class Waits:
    """Stands in for the loop's wake event: records the sleeps, set when the test says."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []
        self.set_flag = False

    def is_set(self) -> bool:
        return self.set_flag

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return self.set_flag


@pytest.fixture
def rig() -> Iterator[Rig]:
    aloop = asyncio.new_event_loop()
    try:
        yield Rig(make_policy(64, 4, 2, 2000), aloop)
    finally:
        aloop.close()


def fake_loop(rig: Rig, monkeypatch: pytest.MonkeyPatch, set_wake_after: int | None = None
              ) -> tuple[Timeline, Waits, list[int]]:
    timeline, waits, slices = Timeline(), Waits(), []

    def keep_warm(micros: int) -> None:
        slices.append(micros)
        timeline.now += micros / 1e6
        if set_wake_after is not None and len(slices) == set_wake_after:
            waits.set_flag = True  # a request posted during this slice

    monkeypatch.setattr(device_loop, "time", timeline)
    monkeypatch.setattr(device_loop, "KEEP_WARM_S", 0.2)
    monkeypatch.setattr(rig.loop, "wake", waits)
    monkeypatch.setattr(rig.loop, "_keep_warm", lambda: keep_warm)
    monkeypatch.setattr(rig.loop, "_next_wake", lambda now: None)  # no deadline: the idle wait is IDLE_WAIT_S
    return timeline, waits, slices


def test_after_work_the_cores_stay_warm_for_the_window_then_the_loop_sleeps(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    timeline, waits, slices = fake_loop(rig, monkeypatch)
    rig.loop._last_work_at = timeline.now
    rig.loop._idle_wait()
    warm_slices = 0.2 * 1e6 / device_loop.KEEP_WARM_SLICE_US
    assert abs(len(slices) - warm_slices) <= 1  # warm until the window's end
    assert waits.timeouts == [pytest.approx(device_loop.IDLE_WAIT_S - 0.2)]  # then asleep for the rest
    rig.loop._idle_wait()  # the window has passed: straight to sleep
    assert len(waits.timeouts) == 2 and waits.timeouts[-1] == device_loop.IDLE_WAIT_S
    assert abs(len(slices) - warm_slices) <= 1  # none more


def test_work_posted_while_warm_ends_the_wait_at_the_next_slice(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    timeline, waits, slices = fake_loop(rig, monkeypatch, set_wake_after=3)
    rig.loop._last_work_at = timeline.now
    rig.loop._idle_wait()
    assert len(slices) == 3 and waits.timeouts == []  # back to the loop at once


def test_a_deadline_inside_the_window_ends_the_warm_wait_on_time(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    timeline, waits, slices = fake_loop(rig, monkeypatch)
    monkeypatch.setattr(rig.loop, "_next_wake", lambda now: now + 0.01)  # a delay window closes in 10 ms
    rig.loop._last_work_at = timeline.now
    rig.loop._idle_wait()
    assert abs(len(slices) - 0.01 * 1e6 / device_loop.KEEP_WARM_SLICE_US) <= 1
    assert waits.timeouts == []  # the deadline is here: back to the loop, no sleep


def test_no_work_yet_means_no_warming(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    _, waits, slices = fake_loop(rig, monkeypatch)
    rig.loop._idle_wait()  # the loop has done nothing since it started
    assert slices == [] and waits.timeouts == [device_loop.IDLE_WAIT_S]


def test_the_real_op_runs_its_time_and_leaves_the_gil_to_other_threads() -> None:
    assert kernels.int8_linear() is not None, "the native kernels did not build (is a C++ compiler installed?)"
    op = kernels.keep_warm()  # served once loaded (it never builds them itself)
    assert op is not None
    counted = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            counted[0] += 1

    thread = threading.Thread(target=count)
    thread.start()
    try:
        time.sleep(0.01)
        before = counted[0]
        start = time.monotonic()
        op(50_000)
        assert time.monotonic() - start >= 0.05  # it kept the threads running that long
        assert counted[0] > before  # the Python thread ran meanwhile: the op does not hold the GIL
    finally:
        stop.set()
        thread.join()
