"""Hypothesis stateful test of prefix caching under both schedulers (FCFS, and the class scheduler with a
voice class above a background one): whatever sequence of adds (prompts that share prefixes, across
classes), steps, aborts (between steps or while a step runs), preemptions and evictions happens, blocks
are conserved, and every chunk attends only to cache slots holding its own prefix.

The shadow runner stands in for the KV cache: each slot records the token prefix its keys would encode,
so a block reused before it was written, or reused for another prefix, fails the run at once.
"""

from __future__ import annotations

import hashlib

import yaml
from engine_helpers import assert_engine_empty
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams, StepOutput, StepPlan
from homeai.policy.loader import parse_policy
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.fcfs import FCFSScheduler
from homeai.scheduling.interface import StepScheduler

NUM_BLOCKS, BLOCK_SIZE = 24, 4
STEP_TOKENS = 7  # not a multiple of the block size: chunks end mid-block
CLASSES = ("voice", "summarize")
POLICY = parse_policy(yaml.safe_dump({
    "classes": {"voice": {"kind": "llm", "model": "m", "priority": 0},
                "summarize": {"kind": "llm", "model": "m", "priority": 1, "background": True, "min_share": 0.2}},
    "scheduler": {"max_num_batched_tokens": STEP_TOKENS, "max_num_seqs": 4}}), source="prefix-stateful")
PREFIXES = ([], [5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 20, 21, 22, 23, 24, 25, 26, 27])  # the last two share a block


def prefix_key(tokens: list[int]) -> bytes:
    return hashlib.sha256(repr(tokens).encode()).digest()


class ShadowRunner:
    """Executes a plan on a shadow cache (slot -> digest of the prefix its KV encodes) and checks every
    context slot a chunk attends to. Samples a token that depends only on the tokens so far (greedy-like),
    so equal prompts grow equal outputs and output blocks are shared too."""

    def __init__(self, bm: BlockManager) -> None:
        self.bm = bm
        self.slots: dict[int, bytes] = {}

    def execute(self, plan: StepPlan, seqs: dict[int, Sequence]) -> StepOutput:
        out = StepOutput()
        for chunk in plan.chunks:
            seq = seqs.get(chunk.seq_id)
            if seq is None:  # aborted while the step ran: its KV is never written
                continue
            if chunk.kv_copy is not None:  # a prefix that ends inside a block: copied as the runner copies
                src, dst, n = chunk.kv_copy
                bs = self.bm.block_size
                for k in range(n):
                    self.slots[dst * bs + k] = self.slots[src * bs + k]
            end = chunk.start + chunk.num_tokens
            assert chunk.start == seq.num_computed_tokens and end <= seq.num_tokens
            tokens = seq.token_ids(0, end)
            for p in range(end):
                slot = self.bm.slot(seq.seq_id, p)
                if p < chunk.start:
                    assert self.slots.get(slot) == prefix_key(tokens[:p + 1]), \
                        f"seq {seq.seq_id} position {p}: cached slot {slot} holds another prefix"
                else:
                    self.slots[slot] = prefix_key(tokens[:p + 1])
            if chunk.sample:
                out.sampled[seq.seq_id] = 1 + prefix_key(tokens)[0] % 40
        return out


class PrefixCacheMachine(RuleBasedStateMachine):
    """Under FCFS; the class-scheduler machine below changes only the scheduler and how it preempts."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True, model="m")
        self.sched = self.make_scheduler()
        self.runner = ShadowRunner(self.bm)
        self.next_id = 0

    def make_scheduler(self) -> StepScheduler:
        return FCFSScheduler(self.bm, max_num_batched_tokens=STEP_TOKENS, max_num_seqs=4, clock=VirtualClock())

    def preempt_now(self, seq: Sequence) -> None:
        assert isinstance(self.sched, FCFSScheduler)
        self.sched._preempt(seq)

    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(1, 3), max_size=4),
          max_tokens=st.integers(1, 8), class_name=st.sampled_from(CLASSES))
    def add(self, prefix: list[int], suffix: list[int], max_tokens: int, class_name: str) -> None:
        prompt = prefix + suffix or [1]
        sid, self.next_id = self.next_id, self.next_id + 1
        self.sched.add(Sequence(sid, f"r{sid}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                class_name=class_name))

    @rule()
    def step(self) -> None:
        plan = self.sched.schedule()
        self.sched.update(plan, self.runner.execute(plan, self.sched.seqs))

    @precondition(lambda self: self.sched.seqs)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.sched.seqs.values(), key=lambda s: s.seq_id)))
        self.sched.abort(seq.request_id)

    @rule(data=st.data())
    def abort_while_a_step_runs(self, data: st.DataObject) -> None:
        plan = self.sched.schedule()
        if plan.chunks:
            chunk = data.draw(st.sampled_from(plan.chunks))
            self.sched.abort(self.sched.seqs[chunk.seq_id].request_id)
        self.sched.update(plan, self.runner.execute(plan, self.sched.seqs))

    def running(self) -> list[Sequence]:
        assert isinstance(self.sched, FCFSScheduler | ClassScheduler)
        return self.sched.running

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        self.preempt_now(data.draw(st.sampled_from(self.running())))

    @rule(num_blocks=st.integers(1, NUM_BLOCKS))
    def evict(self, num_blocks: int) -> None:
        self.bm.evict(num_blocks)

    @invariant()
    def blocks_are_conserved(self) -> None:
        self.bm.check_conserved()

    def teardown(self) -> None:
        for _ in range(1000):
            if not self.sched.has_work():
                break
            self.step()
        assert_engine_empty(self.sched)


class ClassPrefixCacheMachine(PrefixCacheMachine):
    """The same under the class scheduler: voice may preempt the background class for KV blocks."""

    def make_scheduler(self) -> StepScheduler:
        return ClassScheduler(self.bm, POLICY, VirtualClock())

    def preempt_now(self, seq: Sequence) -> None:
        assert isinstance(self.sched, ClassScheduler)
        self.sched._preempt(seq, StepPlan())


PrefixCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
ClassPrefixCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestClassPrefixCacheMachine = ClassPrefixCacheMachine.TestCase
