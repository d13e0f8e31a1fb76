"""The runner reads each chunk's KV block ids from the step plan (``StepScheduler.seal``), not from the
block manager the scheduler owns: a plan whose chunk lacks the blocks for its tokens is refused with the
sequence named, before any KV is written."""

from __future__ import annotations

import pytest
from conftest import build_tiny_engine
from engine_helpers import make_requests

from homeai.core.types import ScheduledChunk, StepPlan
from homeai.engine.llm_engine import LLMEngine
from homeai.runtime.llama import LlamaModel


def test_a_sealed_plan_names_each_sequences_blocks(tiny_model: LlamaModel) -> None:
    engine: LLMEngine = build_tiny_engine(tiny_model, block_size=4)
    for seq in make_requests(3, prompt_len=[9, 2, 5], max_tokens=2):
        engine.scheduler.add(seq)
    plan = engine.scheduler.schedule()
    bm = engine.scheduler.block_manager
    assert {c.seq_id for c in plan.chunks} == {0, 1, 2}
    for chunk in plan.chunks:
        assert chunk.block_table == bm.block_table(chunk.seq_id) != []
    engine.runner.execute(plan, engine.scheduler.seqs)


def test_a_chunk_without_its_blocks_is_refused(tiny_model: LlamaModel) -> None:
    engine = build_tiny_engine(tiny_model, block_size=4)
    seq = make_requests(1, prompt_len=9, max_tokens=1)[0]
    engine.scheduler.add(seq)
    unsealed = StepPlan(chunks=[ScheduledChunk(seq.seq_id, 0, 9, sample=True, block_table=[0, 1])])
    with pytest.raises(ValueError, match=f"sequence {seq.seq_id}: 2 KV blocks for tokens up to 9"):
        engine.runner.prepare(unsealed, engine.scheduler.seqs)
