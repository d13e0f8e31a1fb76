"""Hypothesis stateful test of the class scheduler: whatever sequence of adds, steps, aborts and policy
swaps happens, KV blocks are conserved, each request is in exactly one place (one class queue, the
running batch, or finished), every plan stays within the step limits and the class caps of the policy
in force, and once the work drains every block is back in the pool."""

from __future__ import annotations

from typing import Any

import yaml
from engine_helpers import FAKE_TOKEN, FakeRunner, assert_engine_empty, make_requests
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.scheduling.class_queue import QueueFullError
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock

NUM_BLOCKS, BLOCK_SIZE = 32, 4  # 128 token slots: the longest request (72) fits alone, not twice
USERS = ["ann", "bob", "kid"]


def make_policy(budget: int, max_num_seqs: int, running: dict[str, int], chat: dict[str, Any],
                summarize_share: float) -> Policy:
    voice_queue = {"max_queue_size": 4, "timeout_action": "REJECT", "default_timeout_microseconds": 40_000,
                   "allow_timeout_override": True}
    doc = {
        "classes": {
            "voice": {"kind": "llm", "model": "m", "priority": 0, "max_running": running["voice"],
                      "default_queue_policy": voice_queue},
            "chat": {"kind": "llm", "model": "m", "priority": 1, "max_running": running["chat"], **chat},
            "summarize": {"kind": "llm", "model": "m", "priority": 2, "background": True,
                          "min_share": summarize_share, "max_running": running["summarize"]},
        },
        "users": {"ann": {"weight": 2.0}},
        "scheduler": {"max_num_batched_tokens": budget, "max_num_seqs": max_num_seqs},
    }
    return parse_policy(yaml.safe_dump(doc), source="stateful-policy")


POLICIES = (
    make_policy(48, 4, {"voice": 2, "chat": 3, "summarize": 2},
                {"max_batch_size": 3, "max_queue_delay_microseconds": 2000, "priority_levels": 2,
                 "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 20_000}},
                summarize_share=0.2),
    make_policy(96, 6, {"voice": 1, "chat": 2, "summarize": 3}, {"max_batch_size": 8}, summarize_share=0.1),
)


class ClassSchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
        self.policy_no = 0
        self.sched = ClassScheduler(self.bm, POLICIES[0], self.clock)
        self.runner = FakeRunner()
        self.requests: dict[str, Sequence] = {}  # every request the scheduler accepted
        self.dropped: set[str] = set()  # aborted or rejected (queue timeout)
        self.next_id = 0

    @rule(class_name=st.sampled_from(["voice", "chat", "summarize"]), user=st.sampled_from(USERS),
          prompt_len=st.integers(1, 60), max_tokens=st.integers(1, 12), level=st.sampled_from([None, 1, 2]),
          count=st.integers(1, 3))
    def add(self, class_name: str, user: str, prompt_len: int, max_tokens: int, level: int | None,
            count: int) -> None:
        for seq in make_requests(count, prompt_len, max_tokens, first_id=self.next_id):
            self.next_id += 1
            seq.class_name, seq.user = class_name, user
            seq.priority_level = level
            try:
                self.sched.add(seq)
            except QueueFullError:
                continue
            self.requests[seq.request_id] = seq

    @rule(dt_ms=st.sampled_from([0, 1, 5, 30]))
    def step(self, dt_ms: int) -> None:
        self._step()
        self.clock.advance(dt_ms / 1000)

    def _step(self) -> None:
        sched = self.sched
        plan = sched.schedule()
        assert plan.num_tokens <= sched.max_num_batched_tokens
        ids = [c.seq_id for c in plan.chunks]
        assert len(ids) == len(set(ids)) <= sched.max_num_seqs
        assert sched.num_running <= sched.max_num_seqs
        for name, state in sched.classes.items():
            cap = state.policy.max_running
            assert cap is None or state.num_running <= cap, f"{name}: {state.num_running} > {cap}"
        sched.update(plan, self.runner.execute(plan, sched.seqs))  # checks each chunk's range
        for seq in sched.drain_rejected():
            if seq.refusal is not None:  # pushed out of a full queue for another user's request: a 429
                assert isinstance(seq.refusal, QueueFullError) and seq.status == SequenceStatus.FINISHED_ABORTED
            else:
                assert seq.status == SequenceStatus.FINISHED_TIMED_OUT and seq.error == "queue timeout"
            self.dropped.add(seq.request_id)

    @rule(data=st.data())
    @precondition(lambda self: any(not s.status.is_finished for s in self.requests.values()))
    def abort(self, data: st.DataObject) -> None:
        live = sorted(rid for rid, s in self.requests.items() if not s.status.is_finished)
        rid = data.draw(st.sampled_from(live))
        assert self.sched.abort(rid) is self.requests[rid]
        assert self.requests[rid].status == SequenceStatus.FINISHED_ABORTED
        self.dropped.add(rid)

    @rule()
    def swap_policy(self) -> None:
        self.policy_no ^= 1
        self.sched.apply_policy(POLICIES[self.policy_no])

    @invariant()
    def blocks_are_conserved_and_owned_by_running_sequences(self) -> None:
        self.bm.check_conserved()
        running = {s.seq_id for s in self.sched.running}
        for seq in self.requests.values():
            if seq.seq_id not in running:
                assert self.bm.block_table(seq.seq_id) == []

    @invariant()
    def every_request_is_in_exactly_one_place(self) -> None:
        queued: dict[str, str] = {}
        for name, state in self.sched.classes.items():
            for item in state.queue:
                assert item.request_id not in queued, f"{item.request_id} queued twice"
                queued[item.request_id] = name
        running = [s.request_id for s in self.sched.running]
        assert len(running) == len(set(running))
        for rid, seq in self.requests.items():
            places = (rid in queued) + (rid in running) + seq.status.is_finished
            assert places == 1, f"{rid}: queued={rid in queued} running={rid in running} status={seq.status}"
            if rid in queued:
                assert queued[rid] == seq.class_name
                assert seq.status in (SequenceStatus.WAITING, SequenceStatus.PREEMPTED)
            elif rid in running:
                assert seq.status == SequenceStatus.RUNNING
            assert (self.sched.seqs.get(seq.seq_id) is seq) == (not seq.status.is_finished)
        for name, state in self.sched.classes.items():
            assert state.num_running == sum(s.class_name == name for s in self.sched.running)

    def teardown(self) -> None:
        for _ in range(5000):
            if not self.sched.has_work():
                break
            self._step()
            self.clock.advance(0.01)
        assert_engine_empty(self.sched)
        for rid, seq in self.requests.items():
            assert seq.status.is_finished
            if rid not in self.dropped:
                assert seq.status == SequenceStatus.FINISHED_LENGTH
                assert seq.output_token_ids == [FAKE_TOKEN] * seq.params.max_tokens


TestClassSchedulerMachine = ClassSchedulerMachine.TestCase
TestClassSchedulerMachine.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
