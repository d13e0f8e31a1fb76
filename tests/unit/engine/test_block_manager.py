"""KV block accounting: the pool hands out, takes back and never loses a block, alone and under the
engine (finish, abort, preemption, drain)."""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import assert_engine_empty, make_requests
from waiting import await_until

from homeai.core.block_manager import BlockManager
from homeai.core.types import FinishReason, SamplingParams
from homeai.engine.llm_engine import LLMEngine


def test_allocate_grows_table_block_by_block() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.allocate(0, 1) == [0]
    assert bm.allocate(0, 4) == [0]  # still fits the first block
    assert bm.allocate(0, 5) == [0, 1]
    assert bm.num_free_blocks == 6
    assert bm.slot(0, 5) == 1 * 4 + 1
    assert bm.num_new_blocks(0, 12) == 1
    bm.check_conserved()


def test_free_returns_every_block_and_reuses_them() -> None:
    bm = BlockManager(num_blocks=6, block_size=2)
    a = list(bm.allocate(1, 5))
    bm.allocate(2, 2)
    assert bm.free(1) == 3
    assert bm.free(1) == 0  # a second free is harmless
    assert sorted(bm.allocate(3, 6)) == sorted(a)  # the freed blocks come back
    assert bm.free(2) + bm.free(3) == 4
    assert_engine_empty(bm)


def test_exhaustion_raises_and_changes_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate(0, 12)
    assert bm.can_allocate(1, 4)
    assert not bm.can_allocate(1, 5)
    assert not bm.can_allocate(1, 4, reserve=1)
    with pytest.raises(MemoryError):
        bm.allocate(1, 5)
    assert bm.block_table(1) == []
    assert bm.num_free_blocks == 1
    bm.check_conserved()


def test_check_conserved_catches_a_lost_or_shared_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate(0, 8)
    bm._free.pop()  # a block that vanished
    with pytest.raises(AssertionError):
        bm.check_conserved()
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate(0, 4)
    bm._tables[1] = list(bm._tables[0])  # one block in two tables
    with pytest.raises(AssertionError):
        bm.check_conserved()


def test_invalid_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        BlockManager(0, 16)
    with pytest.raises(ValueError):
        BlockManager(4, 0)


def _submit(engine: LLMEngine, seqs: list) -> None:
    for s in seqs:
        seq = engine.make_sequence(s.prompt_token_ids, s.params, s.request_id)
        engine.scheduler.add(seq)


def _drain(engine: LLMEngine, max_steps: int = 2000) -> dict[str, FinishReason | None]:
    reasons: dict[str, FinishReason | None] = {}
    for _ in range(max_steps):
        if not engine.scheduler.has_work():
            return reasons
        for delta in engine.step():
            engine.scheduler.block_manager.check_conserved()
            if delta.finished:
                reasons[delta.request_id] = delta.finish_reason
    raise AssertionError("engine did not drain")


def test_every_block_back_after_a_drain(make_engine) -> None:
    engine = make_engine(num_blocks=64, block_size=4)
    seqs = make_requests(10, prompt_len=[3, 17, 40, 5, 9, 33, 2, 21, 12, 8], max_tokens=[1, 9, 4, 20, 2, 7, 30, 3,
                                                                                          11, 6])
    _submit(engine, seqs)
    reasons = _drain(engine)
    assert reasons == {s.request_id: FinishReason.LENGTH for s in seqs}
    assert_engine_empty(engine)


def test_preemption_frees_blocks_and_every_request_completes(make_engine) -> None:
    engine = make_engine(num_blocks=12, block_size=4, max_num_batched_tokens=64)  # 48 token slots
    seqs = make_requests(4, prompt_len=10, max_tokens=20)  # each needs 30 slots at the end
    _submit(engine, seqs)
    reasons = _drain(engine)
    assert engine.stats.num_preemptions > 0
    assert reasons == {s.request_id: FinishReason.LENGTH for s in seqs}
    assert_engine_empty(engine)


def test_abort_frees_blocks_before_the_next_step(make_engine) -> None:
    engine = make_engine(num_blocks=32, block_size=4)
    _submit(engine, make_requests(2, prompt_len=12, max_tokens=50))
    for _ in range(3):
        engine.step()
    bm = engine.scheduler.block_manager
    owned = len(bm.block_table(0))
    assert owned > 0
    free_before = bm.num_free_blocks
    engine.abort("req-0")
    engine.drain_inbox()  # what the device loop does first in every iteration
    assert bm.num_free_blocks == free_before + owned
    _drain(engine)
    assert_engine_empty(engine)


async def test_async_streams_and_abort_leave_the_pool_full(small_engine: LLMEngine) -> None:
    async def run(i: int, max_tokens: int) -> tuple[str, FinishReason | None]:
        text, reason = "", None
        async for delta in small_engine.generate([5 + i, 9, 11 + i], SamplingParams(0.0, max_tokens=max_tokens)):
            text, reason = text + delta.text, delta.finish_reason
        return text, reason

    async def abort_midway() -> FinishReason | None:
        params = SamplingParams(0.0, max_tokens=200)
        async for delta in small_engine.generate([1, 2, 3], params, request_id="to-abort"):
            if delta.num_output_tokens >= 3 and not delta.finished:
                small_engine.abort("to-abort")
            if delta.finished:
                return delta.finish_reason
        return None

    results = await asyncio.wait_for(asyncio.gather(*(run(i, 5 + i) for i in range(6)), abort_midway()), 60)
    for i, (text, reason) in enumerate(results[:6]):
        assert reason == FinishReason.LENGTH and len(text) == 5 + i
    assert results[6] == FinishReason.ABORT
    await await_until(small_engine.is_idle, what="the device thread to apply the last aborts")
    assert_engine_empty(small_engine)
