"""Shared test helpers for the engine and its schedulers: requests, a fake runner, a drain loop, and
``assert_engine_empty`` (every KV block back in the pool), which each engine test calls at its end.

No torch here, so scheduling tests stay free of the model runtime. pytest puts ``tests/`` on sys.path
(``tests/conftest.py`` has no package), so tests import this as ``engine_helpers``.
"""

from __future__ import annotations

from typing import Any, Protocol

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams, StepOutput, StepPlan
from homeai.scheduling.class_queue import ClassQueue, PickUser, QueuedItem
from homeai.scheduling.interface import StepScheduler

FAKE_TOKEN = 7  # what the fake runner samples; never an EOS in these tests


def admit(q: ClassQueue, now: float, pick_user: PickUser | None = None) -> QueuedItem | None:
    """What the step planner does: apply timeouts, then take the request ``peek_for_admission`` offers."""
    q.expire(now)
    item = q.peek_for_admission(now, pick_user)
    if item is not None:
        q.take(item, now)
    return item


class Runner(Protocol):
    def execute(self, plan: StepPlan, seqs: dict[int, Sequence]) -> StepOutput: ...


def _block_manager(obj: Any) -> BlockManager:
    """The block manager of an engine, a scheduler, or the block manager itself."""
    if isinstance(obj, BlockManager):
        return obj
    scheduler = getattr(obj, "scheduler", obj)
    return scheduler.block_manager


def assert_engine_empty(obj: Any) -> None:
    """Every KV block is back in the pool and no sequence is left (engine, scheduler or block manager)."""
    bm = _block_manager(obj)
    bm.check_conserved()
    assert bm.num_free_blocks == bm.num_blocks, f"{bm.num_blocks - bm.num_free_blocks} blocks still owned"
    scheduler = getattr(obj, "scheduler", obj)
    if isinstance(scheduler, StepScheduler):
        assert not scheduler.has_work(), f"{scheduler.num_waiting} waiting, {scheduler.num_running} running"
        assert not scheduler.seqs, f"sequences left: {sorted(scheduler.seqs)}"


def make_requests(num: int, prompt_len: int | list[int] = 8, max_tokens: int | list[int] = 4,
                  first_id: int = 0, eos_token_ids: frozenset[int] = frozenset(), vocab_size: int = 128,
                  **params: Any) -> list[Sequence]:
    """``num`` greedy sequences with distinct prompts of ids in [1, vocab_size); lengths and max_tokens
    may vary per request (lists); ``params`` go to SamplingParams."""
    seqs = []
    for i in range(num):
        n = prompt_len[i] if isinstance(prompt_len, list) else prompt_len
        m = max_tokens[i] if isinstance(max_tokens, list) else max_tokens
        sid = first_id + i
        prompt = [1 + (sid * 31 + j * 7) % (vocab_size - 1) for j in range(n)]
        sp = SamplingParams(**({"temperature": 0.0} | params), max_tokens=m)
        seqs.append(Sequence(sid, f"req-{sid}", prompt, sp, eos_token_ids=eos_token_ids, arrival_s=float(i)))
    return seqs


class FakeRunner:
    """Executes a plan without a model: every sampling chunk gets ``token``; records each plan."""

    def __init__(self, token: int = FAKE_TOKEN) -> None:
        self.token = token
        self.plans: list[StepPlan] = []

    def execute(self, plan: StepPlan, seqs: dict[int, Sequence]) -> StepOutput:
        self.plans.append(plan)
        for chunk in plan.chunks:  # the plan must only name live sequences with sane ranges
            seq = seqs[chunk.seq_id]
            assert chunk.start == seq.num_computed_tokens
            assert chunk.start + chunk.num_tokens <= seq.num_tokens
        return StepOutput(sampled={c.seq_id: self.token for c in plan.chunks if c.sample})


def step(scheduler: StepScheduler, runner: Runner) -> tuple[StepPlan, list[Sequence]]:
    """One engine step: plan, execute, apply; checks block conservation after it."""
    plan = scheduler.schedule()
    bm = scheduler.block_manager
    for chunk in plan.chunks:  # sealed: each chunk carries the KV blocks the runner reads and writes
        assert chunk.block_table == bm.block_table(chunk.seq_id)
        assert len(chunk.block_table) * bm.block_size >= chunk.start + chunk.num_tokens
    output = runner.execute(plan, scheduler.seqs)
    touched = scheduler.update(plan, output)
    scheduler.block_manager.check_conserved()
    return plan, touched


def drain(scheduler: StepScheduler, runner: Runner, max_steps: int = 10_000) -> dict[int, Sequence]:
    """Run steps until no work is left; returns every sequence that finished, by id."""
    finished: dict[int, Sequence] = {}
    for _ in range(max_steps):
        if not scheduler.has_work():
            return finished
        _, touched = step(scheduler, runner)
        finished.update({s.seq_id: s for s in touched if s.status.is_finished})
    raise AssertionError(f"scheduler still has work after {max_steps} steps")
