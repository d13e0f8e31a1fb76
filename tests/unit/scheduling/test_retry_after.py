"""A class's 429 Retry-After never exceeds how long its queue lets a request wait.

Voice requests time out after 10 s in the queue, yet its 429s said Retry-After 60 and 30: the estimate
(requests ahead times the time between departures) read a quiet stretch before the burst as a slow queue.
"""

from __future__ import annotations

from typing import Any

import pytest

from homeai.policy.schema import ClassPolicy
from homeai.scheduling.class_queue import MAX_RETRY_AFTER_S, ClassQueue, QueuedItem, QueueFullError
from homeai.scheduling.clock import VirtualClock

VOICE = {"kind": "embedding", "model": "m", "max_batch_size": 1, "max_queue_delay_microseconds": 0,
         "default_queue_policy": {"max_queue_size": 4, "default_timeout_microseconds": 10_000_000}}


def make_queue(**fields: Any) -> ClassQueue:
    return ClassQueue("voice", ClassPolicy.model_validate({**VOICE, **fields}))


def fill_and_reject(q: ClassQueue, clock: VirtualClock, prefix: str) -> float:
    """Fill the queue, then the next push: its Retry-After."""
    for i in range(4):
        q.push(QueuedItem(f"{prefix}{i}", "u"), clock.now())
    with pytest.raises(QueueFullError) as info:
        q.push(QueuedItem(f"{prefix}x", "u"), clock.now())
    return info.value.retry_after_s


def test_a_quiet_spell_before_a_burst_does_not_stretch_retry_after() -> None:
    clock, q = VirtualClock(), make_queue()
    for i in range(3):  # a few departures, far apart: one every 5 minutes
        q.push(QueuedItem(f"old{i}", "u"), clock.now())
        assert q.form_batch(clock.now()) is not None
        clock.advance(300.0)
    retry_s = fill_and_reject(q, clock, "burst")
    assert 1.0 <= retry_s <= 10.0


def test_retry_after_is_capped_by_the_queue_timeout_and_60_s() -> None:
    clock, q = VirtualClock(), make_queue()
    for i in range(8):  # slow but recent departures: 4 s apart, inside the 10 s horizon
        q.push(QueuedItem(f"slow{i}", "u"), clock.now())
        assert q.form_batch(clock.now()) is not None
        clock.advance(4.0 if i < 7 else 0.0)
    assert fill_and_reject(q, clock, "a") == 10.0  # 5 ahead x 4 s = 20 s, capped by the timeout
    untimed = make_queue(default_queue_policy={"max_queue_size": 4})
    assert fill_and_reject(untimed, clock, "b") == 1.0  # no departures yet: the delay window, at least 1 s
    assert MAX_RETRY_AFTER_S == 60.0
