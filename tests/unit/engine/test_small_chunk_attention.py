"""A prompt chunk attends through the paged prefill kernel: the same logits as SDPA over its gathered
context, for a first chunk and a chunk in mid-prompt, beside a decode row."""

from __future__ import annotations

import pytest
import torch
from llama_helpers import random_llama_weights

from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams, ScheduledChunk, StepPlan
from homeai.engine import model_runner
from homeai.engine.model_runner import ModelRunner
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.runtime.llama_config import LlamaConfig

BLOCK = 4


def _runner() -> ModelRunner:
    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=6,
                      num_kv_heads=2, head_dim=64, max_position_embeddings=256, tie_word_embeddings=True)
    model = LlamaModel(cfg, random_llama_weights(cfg, seed=3, scale=0.08, embed_scale=10), torch.device("cpu"),
                       torch.float32)
    if model.prefill_attention is None:
        pytest.skip("the native prefill-attention kernel is not available here")
    return ModelRunner(model, KVCache(cfg.num_layers, 32, BLOCK, cfg.num_kv_heads, cfg.head_dim, model.device,
                                      model.kv_dtype))


def _logits(runner: ModelRunner, limit: int | None, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Sampled rows' logits of three steps: a decode row beside prompt chunks of 5, 1 and 6 tokens."""
    monkeypatch.setattr(model_runner, "PREFILL_KERNEL_MAX_ROW_SLOTS", limit)
    seqs = {1: Sequence(1, "a", list(range(1, 10)), SamplingParams(temperature=0.0, max_tokens=2)),
            2: Sequence(2, "b", list(range(40, 52)), SamplingParams(temperature=0.0, max_tokens=2))}
    table_a, table_b = [0, 1, 2], [5, 6, 7]
    steps = [
        [ScheduledChunk(1, 0, 9, True, table_a), ScheduledChunk(2, 0, 5, False, table_b)],  # b: a first chunk
        [ScheduledChunk(1, 9, 1, True, table_a), ScheduledChunk(2, 5, 1, False, table_b)],
        [ScheduledChunk(1, 10, 1, True, table_a), ScheduledChunk(2, 6, 6, True, table_b)],  # b: mid-prompt
    ]
    out = []
    for chunks in steps:
        logits, _ = runner._forward(runner.prepare(StepPlan(chunks), seqs))
        out.append(logits.clone())
        seqs[1].append_token(int(logits[0].argmax()))
    return out


def test_prompt_chunks_through_the_prefill_kernel_match_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _logits(_runner(), None, monkeypatch)
    sdpa = _logits(_runner(), 0, monkeypatch)  # every chunk over the bound: SDPA, as on AMX for long ones
    for got, want in zip(kernel, sdpa, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert kernel[2].shape[0] == 2  # the mid-prompt chunk that ends the prompt samples too


def test_the_prefill_kernel_serves_multi_token_chunks_and_decode_rows_single_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner()
    monkeypatch.setattr(model_runner, "PREFILL_KERNEL_MAX_ROW_SLOTS", None)
    seqs = {1: Sequence(1, "a", list(range(1, 10)), SamplingParams(temperature=0.0, max_tokens=2)),
            2: Sequence(2, "b", list(range(40, 52)), SamplingParams(temperature=0.0, max_tokens=2))}
    seqs[1].append_token(3)
    meta = runner.prepare(StepPlan([ScheduledChunk(1, 9, 1, True, [0, 1, 2]),
                                    ScheduledChunk(2, 4, 8, True, [5, 6, 7])]), seqs).meta
    assert meta.decode_lens is not None and meta.decode_lens.tolist() == [10]
    (chunk,) = meta.prefills
    assert (chunk.token_start, chunk.num_tokens, chunk.paged_start) == (1, 8, 4)
    assert chunk.context_slots is not None
    assert chunk.context_slots.tolist() == [5 * BLOCK + p if p < BLOCK else 6 * BLOCK + p - BLOCK
                                            if p < 2 * BLOCK else 7 * BLOCK + p - 2 * BLOCK for p in range(12)]
