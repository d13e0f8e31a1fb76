"""A class queue's queries never mutate it, and no request vanishes.

``next_expiry_at``, ``next_ready_at`` and the head lookups used to pop from the deadline heap and the
deques; called from another thread they raced with ``push`` and a timeout was lost. And ``push``
applied timeouts itself and parked what it rejected where nobody looked, so a request was
neither queued, handed out nor reported.
"""

from __future__ import annotations

import copy
from typing import Any

from engine_helpers import admit

from homeai.policy.schema import ClassPolicy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem
from homeai.scheduling.clock import VirtualClock

US = 1e-6


def make_queue(kind: str = "embedding", **fields: Any) -> ClassQueue:
    return ClassQueue("c", ClassPolicy.model_validate({"kind": kind, "model": "m", **fields}))


def structure(q: ClassQueue) -> Any:
    """Everything a query could disturb: the deadline heap and every line of every level."""
    levels = {no: (list(lv.main), list(lv.delayed), {u: list(d) for u, d in lv.user_main.items()},
                   {u: list(d) for u, d in lv.user_delayed.items()}, dict(lv.user_live), lv.num_live)
              for no, lv in q._levels.items()}
    return copy.copy(q._deadlines), levels, list(q._rejected), q._released_until_s


def test_queries_leave_the_heap_and_the_lines_untouched() -> None:
    clock = VirtualClock()
    q = make_queue("llm", max_queue_delay_microseconds=2000,
                   default_queue_policy={"default_timeout_microseconds": 10_000_000})
    for i, user in enumerate(["ann", "bob", "ann", "cy"]):
        q.push(QueuedItem(f"r{i}", user), clock.now())
    q.cancel("r0")  # its heap entry and its deque entries go stale
    q.take(q.peek_for_admission(clock.now() + 1.0) or QueuedItem("x", "x"), clock.now())
    before = structure(q)
    for _ in range(3):
        q.next_expiry_at()
        q.next_ready_at(clock.now())
        q.peek_for_admission(clock.now() + 20.0)  # past every deadline: still no timeout applied
        q.peek_for_admission(clock.now() + 20.0, lambda users: users[-1])
        list(q)
        len(q)
        for level in q._levels.values():
            level.head()
            level.users_by_head()
            level.oldest_arrival_s()
    assert structure(q) == before


def test_hypothesis_example_a_request_timed_out_during_a_push_stays_accounted_for() -> None:
    """push(ann, 500 us) / swap_policy(REJECT, delay 0, max_size 0) / admit / advance 500 us / requeue /
    push(ann): r0 timed out while r1 was pushed; it must stay queued until expire() reports it."""
    clock = VirtualClock()
    queue_policy = {"timeout_action": "REJECT", "default_timeout_microseconds": 3000,
                    "allow_timeout_override": True}
    q = make_queue(max_batch_size=4, preferred_batch_size=[2, 4], max_queue_delay_microseconds=1000,
                   priority_levels=2, default_queue_policy={**queue_policy, "max_queue_size": 12})
    q.push(QueuedItem("r0", "ann", timeout_override_us=500), clock.now())
    q.set_policy(ClassPolicy.model_validate({
        "kind": "embedding", "model": "m", "max_batch_size": 4, "preferred_batch_size": [2, 4],
        "max_queue_delay_microseconds": 0, "priority_levels": 2,
        "default_queue_policy": {**queue_policy, "max_queue_size": 0}}))
    r0 = admit(q, clock.now())
    assert r0 is not None and r0.request_id == "r0"
    clock.advance(500 * US)
    assert q.expire(clock.now()) == []  # r0 is out (taken), not queued
    q.requeue_front(r0)
    q.push(QueuedItem("r1", "ann"), clock.now())
    assert {i.request_id for i in q} == {"r0", "r1"}  # nothing vanished
    assert [i.request_id for i in q.expire(clock.now())] == ["r0"]  # and the timeout is reported
    assert [i.request_id for i in q] == ["r1"]
