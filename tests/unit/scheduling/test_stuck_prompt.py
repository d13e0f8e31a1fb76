"""A prompt whose cached prefix ends inside a published block, long enough to need the whole KV pool with its
first output token (a regenerated long chat when the pool is about the context's size: Llama-3-8B at the
default 256 MB), asked one block more than the pool has every step: it never started, and the chats and
background behind it waited for good. And while LLM steps came back empty, no search (embedding) batch ran."""

from __future__ import annotations

from pathlib import Path

import yaml
from engine_helpers import FakeRunner, drain

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import SamplingParams, StepPlan
from homeai.policy.loader import load_policy, parse_policy
from homeai.scheduling.batcher import Batcher
from homeai.scheduling.class_queue import QueuedItem
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.device import run_once

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
POLICY = parse_policy(yaml.safe_dump({
    "classes": {"voice": {"kind": "llm", "model": "m", "priority": 0},
                "chat": {"kind": "llm", "model": "m", "priority": 1},
                "summarize": {"kind": "llm", "model": "m", "priority": 2, "background": True, "min_share": 0.05}},
    "scheduler": {"max_num_batched_tokens": 64, "max_num_seqs": 4}}), source="test")


def request(seq_id: int, cls: str, prompt: list[int], max_tokens: int) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                    class_name=cls, user="u")


def test_a_prompt_filling_the_pool_after_a_partial_prefix_hit_runs_and_so_does_everyone_behind_it() -> None:
    bm = BlockManager(16, 4, enable_prefix_caching=True, model="m")  # 64 tokens
    sched, runner = ClassScheduler(bm, POLICY, VirtualClock()), FakeRunner()
    sched.add(request(0, "chat", [5, 6, 7, 8, 9, 10], 2))  # an earlier turn: its blocks are published
    drain(sched, runner)
    big = request(1, "chat", [5] + [11] * 62, 1)  # 63 + 1 tokens: the whole pool, sharing token 5
    others = [request(2, "chat", [20, 21], 1), request(3, "summarize", [30, 31], 1)]
    for seq in (big, *others):
        sched.add(seq)
    finished = drain(sched, runner, max_steps=200)
    assert {seq.seq_id for seq in (big, *others)} <= set(finished)
    assert all(seq.status == SequenceStatus.FINISHED_LENGTH for seq in (big, *others))


def test_an_empty_llm_step_does_not_hold_back_search() -> None:
    policy = load_policy(DEFAULT_POLICY)
    clock = VirtualClock()
    sched = ClassScheduler(BlockManager(64, 16, enable_prefix_caching=True), policy, clock)
    sched.add(request(0, "chat", [1, 2, 3], 4))  # waiting: the LLM has work it plans nothing for (below)
    sched.schedule = lambda: StepPlan([])  # type: ignore[method-assign]  # whatever keeps its plan empty
    batcher = Batcher(policy, sched, clock)
    served: list[str] = []

    class Device:
        def apply_inbox(self) -> None: ...
        def fail_expired(self) -> None: ...

        def llm_step(self, model: str | None = None) -> bool:
            return not sched.schedule().is_empty

        def embed_batch(self, work: object) -> None:
            served.extend(item.request_id for item in work.items)  # type: ignore[attr-defined]
            clock.advance(0.002)

    device = Device()
    for i in range(3):
        batcher.push_embedding("embedding", QueuedItem(f"q{i}", "alice", cost=8))
        for _ in range(20):
            if not run_once(batcher, device):  # type: ignore[arg-type]
                clock.advance(0.01)
    assert served == ["q0", "q1", "q2"]
