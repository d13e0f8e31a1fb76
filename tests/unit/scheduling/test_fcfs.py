"""FCFS continuous batching on a fake runner: token budget, chunked prefill beside running decodes,
the sequence cap, preemption (recompute later) when the KV pool runs dry, and abort."""

from __future__ import annotations

import random

from engine_helpers import FAKE_TOKEN, FakeRunner, assert_engine_empty, drain, make_requests, step

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import SequenceStatus
from homeai.core.types import StepOutput
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.fcfs import FCFSScheduler


def make_scheduler(num_blocks: int = 256, block_size: int = 4, budget: int = 64,
                   max_num_seqs: int = 64) -> FCFSScheduler:
    return FCFSScheduler(BlockManager(num_blocks, block_size), budget, max_num_seqs, VirtualClock())


def test_token_budget_is_respected_and_everyone_finishes() -> None:
    sched, runner = make_scheduler(budget=24), FakeRunner()
    seqs = make_requests(12, prompt_len=[5, 40, 3, 17, 60, 1, 9, 24, 2, 33, 8, 11], max_tokens=[3, 1, 8] * 4)
    for s in seqs:
        sched.add(s)
    finished = drain(sched, runner)
    assert all(p.num_tokens <= 24 for p in runner.plans)
    assert max(p.num_tokens for p in runner.plans) == 24  # the budget is actually used
    assert sorted(finished) == [s.seq_id for s in seqs]
    for s in seqs:
        assert s.status == SequenceStatus.FINISHED_LENGTH
        assert s.output_token_ids == [FAKE_TOKEN] * s.params.max_tokens
    assert_engine_empty(sched)


def test_waiting_sequences_are_admitted_in_arrival_order() -> None:
    sched, runner = make_scheduler(budget=10), FakeRunner()
    for s in make_requests(4, prompt_len=6, max_tokens=2):
        sched.add(s)
    plan, _ = step(sched, runner)
    assert [(c.seq_id, c.num_tokens) for c in plan.chunks] == [(0, 6), (1, 4)]  # 1's prompt is cut
    plan, _ = step(sched, runner)
    # decode of 0, rest of 1, all of 2, then the first token of 3 with what is left
    assert [(c.seq_id, c.num_tokens) for c in plan.chunks] == [(0, 1), (1, 2), (2, 6), (3, 1)]
    drain(sched, runner)
    assert_engine_empty(sched)


def test_long_prompt_is_chunked_while_running_decodes_get_a_token_every_step() -> None:
    sched, runner = make_scheduler(budget=16), FakeRunner()
    decoders = make_requests(3, prompt_len=4, max_tokens=40)
    for s in decoders:
        sched.add(s)
    step(sched, runner)  # the three prefills
    (long_seq,) = make_requests(1, prompt_len=100, max_tokens=2, first_id=10)
    sched.add(long_seq)
    covered, steps = 0, 0
    while long_seq.num_computed_tokens < 100:
        before = [len(s.output_token_ids) for s in decoders]
        plan, _ = step(sched, runner)
        steps += 1
        assert [len(s.output_token_ids) for s in decoders] == [b + 1 for b in before]
        long_chunks = [c for c in plan.chunks if c.seq_id == long_seq.seq_id]
        assert len(long_chunks) == 1 and long_chunks[0].start == covered
        assert long_chunks[0].num_tokens <= 16 - 3
        assert long_chunks[0].sample == (covered + long_chunks[0].num_tokens == 100)
        covered += long_chunks[0].num_tokens
    assert steps == -(-100 // 13)  # a 100-token prompt took ceil(100 / 13) steps, never a stall
    assert long_seq.output_token_ids == [FAKE_TOKEN]  # sampled only once the prompt was complete
    drain(sched, runner)
    assert_engine_empty(sched)


def test_max_num_seqs_caps_the_batch() -> None:
    sched, runner = make_scheduler(max_num_seqs=3), FakeRunner()
    for s in make_requests(8, prompt_len=2, max_tokens=5):
        sched.add(s)
    while sched.has_work():
        plan, _ = step(sched, runner)
        assert len(plan.chunks) <= 3 and sched.num_running <= 3
    assert_engine_empty(sched)


def test_pool_exhaustion_preempts_the_newest_and_it_recomputes_later() -> None:
    sched, runner = make_scheduler(num_blocks=10, block_size=4), FakeRunner()  # 40 token slots
    seqs = make_requests(3, prompt_len=8, max_tokens=16)  # each grows to 24 slots
    for s in seqs:
        sched.add(s)
    preempted_at: dict[int, int] = {}
    while sched.has_work() and not preempted_at:
        plan, _ = step(sched, runner)
        for sid in plan.preempted:
            victim = seqs[sid]
            preempted_at[sid] = victim.num_output_tokens
            assert victim.status == SequenceStatus.PREEMPTED
            assert victim.num_computed_tokens == 0
            assert sched.block_manager.block_table(sid) == []
            assert sched.waiting[0] is victim  # first in line to come back
            assert all(c.seq_id != sid for c in plan.chunks)
    assert preempted_at and max(preempted_at) == 2  # the newest running sequence went first
    victim = seqs[2]
    plan, _ = step(sched, runner)
    while not any(c.seq_id == 2 for c in plan.chunks):
        plan, _ = step(sched, runner)
    (chunk,) = [c for c in plan.chunks if c.seq_id == 2]
    assert chunk.start == 0 and chunk.num_tokens == 8 + preempted_at[2]  # prompt + output again
    assert chunk.sample
    drain(sched, runner)
    for s in seqs:
        assert s.status == SequenceStatus.FINISHED_LENGTH and s.output_token_ids == [FAKE_TOKEN] * 16
    assert victim.num_preemptions >= 1 and sched.num_preemptions >= 1
    assert_engine_empty(sched)


def test_abort_frees_blocks_at_once_wherever_the_sequence_is() -> None:
    sched, runner = make_scheduler(max_num_seqs=2), FakeRunner()
    a, b, c = make_requests(3, prompt_len=9, max_tokens=50)
    for s in (a, b, c):
        sched.add(s)
    step(sched, runner)
    step(sched, runner)
    free = sched.block_manager.num_free_blocks
    owned = len(sched.block_manager.block_table(a.seq_id))
    assert sched.abort(a.request_id) is a  # running
    assert sched.block_manager.num_free_blocks == free + owned
    assert a.status == SequenceStatus.FINISHED_ABORTED and a.seq_id not in sched.seqs
    assert sched.abort(c.request_id) is c  # still waiting
    assert sched.abort("nobody") is None
    plan = sched.schedule()
    assert sched.abort(b.request_id) is b  # aborted while its step runs: the result is dropped
    assert sched.update(plan, runner.execute(plan, {b.seq_id: b})) == []
    assert_engine_empty(sched)


def test_stop_token_and_eos_finish_with_stop() -> None:
    sched = make_scheduler()
    (s1,) = make_requests(1, max_tokens=10, stop_token_ids=[FAKE_TOKEN])
    (s2,) = make_requests(1, max_tokens=10, first_id=1, eos_token_ids=frozenset({FAKE_TOKEN}))
    (s3,) = make_requests(1, max_tokens=3, first_id=2, eos_token_ids=frozenset({FAKE_TOKEN}), ignore_eos=True)
    for s in (s1, s2, s3):
        sched.add(s)
    drain(sched, FakeRunner())
    assert s1.status == s2.status == SequenceStatus.FINISHED_STOPPED
    assert s1.output_token_ids == s2.output_token_ids == [FAKE_TOKEN]
    assert s3.status == SequenceStatus.FINISHED_LENGTH and len(s3.output_token_ids) == 3
    assert_engine_empty(sched)


def test_random_arrivals_and_aborts_never_lose_a_block() -> None:
    rng = random.Random(5)
    sched, runner = make_scheduler(num_blocks=24, block_size=4, budget=32, max_num_seqs=6), FakeRunner()
    live: list[str] = []
    next_id = 0
    for _ in range(400):
        if rng.random() < 0.3:
            (s,) = make_requests(1, prompt_len=rng.randint(1, 40), max_tokens=rng.randint(1, 30),
                                 first_id=next_id)
            next_id += 1
            sched.add(s)
            live.append(s.request_id)
        if live and rng.random() < 0.05:
            sched.abort(live.pop(rng.randrange(len(live))))
        plan = sched.schedule()
        assert plan.num_tokens <= 32
        sched.update(plan, runner.execute(plan, sched.seqs))
        sched.block_manager.check_conserved()
    drain(sched, runner)
    assert sched.num_preemptions > 0  # the small pool really was contended
    assert_engine_empty(sched)


def test_update_skips_chunks_that_do_not_sample() -> None:
    sched = make_scheduler(budget=4)
    (s,) = make_requests(1, prompt_len=10, max_tokens=1)
    sched.add(s)
    plan = sched.schedule()
    assert not plan.chunks[0].sample
    assert sched.update(plan, StepOutput(sampled={s.seq_id: 3})) == []  # a stray token is ignored
    assert s.num_computed_tokens == 4 and s.output_token_ids == []
    drain(sched, FakeRunner())
    assert_engine_empty(sched)
