"""Prefix caching under the class scheduler: an admission starts after its cached prefix, so the step
budget and the user's virtual token counter count only the tokens computed; the KV check counts
cached blocks nobody holds as taken from the pool; eviction never takes a block a running sequence
of another class holds."""

from __future__ import annotations

import yaml
from engine_helpers import FakeRunner, assert_engine_empty, drain, step

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock

SYSTEM = list(range(1, 33))  # 32 tokens: 8 full blocks of 4


def policy() -> Policy:
    doc = {"classes": {"voice": {"kind": "llm", "model": "m", "priority": 0},
                       "summarize": {"kind": "llm", "model": "m", "priority": 2, "background": True}},
           "scheduler": {"max_num_batched_tokens": 64, "max_num_seqs": 8}}
    return parse_policy(yaml.safe_dump(doc), source="prefix-policy")


def make(sid: int, prompt: list[int], class_name: str = "voice", user: str = "ann",
         max_tokens: int = 2) -> Sequence:
    return Sequence(sid, f"r{sid}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                    class_name=class_name, user=user)


def scheduler(num_blocks: int = 64, caching: bool = True) -> ClassScheduler:
    return ClassScheduler(BlockManager(num_blocks, 4, enable_prefix_caching=caching), policy(), VirtualClock())


def served_counter(caching: bool) -> tuple[float, list[tuple[int, int]]]:
    sched, runner = scheduler(caching=caching), FakeRunner()
    sched.add(make(0, SYSTEM + [40], user="bob"))
    drain(sched, runner)
    sched.add(make(1, SYSTEM + [50, 51, 52]))
    plan, _ = step(sched, runner)
    counter = float(sched.classes["voice"].vtc.snapshot()["ann"])
    drain(sched, runner)
    assert_engine_empty(sched)
    return counter, [(c.start, c.num_tokens) for c in plan.chunks]


def test_a_cached_prefix_is_neither_computed_nor_charged() -> None:
    warm, warm_chunks = served_counter(caching=True)
    cold, cold_chunks = served_counter(caching=False)
    assert warm_chunks == [(32, 3)] and cold_chunks == [(0, 35)]
    assert warm < cold


def test_admission_counts_unheld_cached_blocks_against_the_pool() -> None:
    sched, runner = scheduler(num_blocks=12), FakeRunner()
    sched.add(make(0, SYSTEM + [40]))  # 9 blocks at its end; 8 published, kept after it ends
    drain(sched, runner)
    holder = make(1, list(range(100, 113)), max_tokens=8)
    sched.add(holder)  # takes the 4 plain free blocks
    step(sched, runner)
    # The background request would reuse the 8 cached blocks, but nobody holds them: they count as
    # taken from the pool, so 8 + 3 fresh do not fit in the 8 left (and it may not preempt voice).
    late = make(2, SYSTEM + list(range(60, 72)), class_name="summarize")  # 12 blocks at its end
    sched.add(late)
    plan, _ = step(sched, runner)
    assert all(c.seq_id != late.seq_id for c in plan.chunks)
    bm = sched.block_manager
    assert len(bm.block_table(holder.seq_id)) == 4
    drain(sched, runner)  # the holder grows (evicting the prefix's tail), ends; then the late one runs
    assert bm.stats.num_evictions >= 1
    assert 0 < bm.stats.snapshot()["summarize"]["num_hit_tokens"] < 32
    assert_engine_empty(sched)
