"""Hypothesis stateful test: whatever happens (push, cancel, timeouts, batches, admissions, requeues,
policy swaps), every request is in the queue at most once, comes out at most once, never after it was
cancelled, and the counts agree with what went in and out."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from homeai.policy.schema import ClassPolicy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem, QueueFullError
from homeai.scheduling.clock import VirtualClock

USERS = ["ann", "bob", "cy"]


def policy(action: str, max_size: int, delay_us: int, kind: str = "embedding") -> ClassPolicy:
    queue: dict[str, Any] = {"max_queue_size": max_size, "timeout_action": action,
                             "default_timeout_microseconds": 3000, "allow_timeout_override": True}
    return ClassPolicy.model_validate({
        "kind": kind, "model": "m", "max_batch_size": 4,
        "preferred_batch_size": [2, 4] if kind == "embedding" else [],  # an LLM class refuses them
        "max_queue_delay_microseconds": delay_us, "priority_levels": 2,
        "default_queue_policy": queue, "priority_queue_policy": {2: {**queue, "timeout_action": "DELAY"}},
    })


class ClassQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock()
        self.q = ClassQueue("c", policy("REJECT", 12, 1000))
        self.live: dict[str, QueuedItem] = {}
        self.out: set[str] = set()  # requests that came out (batch, admission or rejection)
        self.taken: list[QueuedItem] = []  # admitted but not run: may be requeued
        self.n = 0

    def _came_out(self, items: list[QueuedItem]) -> None:
        for item in items:
            assert item.request_id in self.live, f"{item.request_id} came out but was not queued"
            assert not item.cancelled
            assert item.request_id not in self.out
            del self.live[item.request_id]
            self.out.add(item.request_id)

    @rule(user=st.sampled_from(USERS), level=st.sampled_from([None, 1, 2, 3]),
          override=st.sampled_from([None, 500, 10_000]))
    def push(self, user: str, level: int | None, override: int | None) -> None:
        item = QueuedItem(f"r{self.n}", user, priority_level=level, timeout_override_us=override)
        self.n += 1
        level_users = {it.request_id: it.user for it in self.live.values()}
        try:
            self.q.push(item, self.clock.now())
        except QueueFullError:
            assert not self.q.take_pushed_out()
            return
        self.live[item.request_id] = item
        for victim, refusal in self.q.take_pushed_out():  # a full level made room for ``user``
            assert victim.user != user and level_users[victim.request_id] == victim.user
            assert isinstance(refusal, QueueFullError)
            self._came_out([victim])

    @rule(data=st.data())
    @precondition(lambda self: self.live)
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        assert self.q.cancel(rid) is not None  # the owner cancels (others post to its inbox)
        del self.live[rid]

    @rule(dt_us=st.integers(0, 2500))
    def advance(self, dt_us: int) -> None:
        self.clock.advance(dt_us * 1e-6)
        self._came_out(self.q.expire(self.clock.now()))

    @rule(max_size=st.sampled_from([None, 1, 3]))
    def batch(self, max_size: int | None) -> None:
        self._came_out(self.q.form_batch(self.clock.now(), max_size) or [])
        self._came_out(self.q.expire(self.clock.now()))

    @rule(pick_last=st.booleans())
    def admit(self, pick_last: bool) -> None:
        now = self.clock.now()
        self._came_out(self.q.expire(now))
        item = self.q.peek_for_admission(now, (lambda u: u[-1]) if pick_last else None)
        if item is not None:
            self.q.take(item, now)
            self._came_out([item])
            self.out.discard(item.request_id)  # it may come back through requeue_front
            self.taken.append(item)
        self._came_out(self.q.expire(self.clock.now()))

    @rule()
    @precondition(lambda self: self.taken)
    def requeue(self) -> None:
        item = self.taken.pop()
        self.q.requeue_front(item)
        self.live[item.request_id] = item

    @rule(action=st.sampled_from(["REJECT", "DELAY"]), max_size=st.sampled_from([0, 3, 12]),
          delay_us=st.sampled_from([0, 1000]), kind=st.sampled_from(["embedding", "llm"]))
    def swap_policy(self, action: str, max_size: int, delay_us: int, kind: str) -> None:
        self.q.set_policy(policy(action, max_size, delay_us, kind))

    @invariant()
    def queue_holds_exactly_the_live_requests_once(self) -> None:
        listed = [item.request_id for item in self.q]
        assert len(listed) == len(set(listed))
        assert set(listed) == set(self.live)
        assert len(self.q) == len(self.live) == sum(self.q.depth_by_level().values())
        assert all(rid in self.q for rid in self.live)
        levels = [item.priority_level or 0 for item in self.q]
        assert levels == sorted(levels)
        assert self.q.users_queued() == {item.user for item in self.live.values()}


TestClassQueueMachine = ClassQueueMachine.TestCase
TestClassQueueMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
