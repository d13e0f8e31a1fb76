"""A prompt chunk of a few tokens attends token by token through the paged decode kernel: the same logits
as SDPA over its gathered context, for a first chunk and a chunk in mid-prompt, beside a decode row."""

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
    if model.paged_attention is None:
        pytest.skip("the native decode-attention kernel is not available here")
    return ModelRunner(model, KVCache(cfg.num_layers, 32, BLOCK, cfg.num_kv_heads, cfg.head_dim, model.device,
                                      model.kv_dtype))


def _logits(runner: ModelRunner, limit: int, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Sampled rows' logits of three steps: a decode row beside prompt chunks of 5, 1 and 6 tokens."""
    monkeypatch.setattr(model_runner, "DECODE_ATTENTION_MAX_CHUNK", limit)
    monkeypatch.setattr(model_runner, "DECODE_ATTENTION_MAX_ROW_SLOTS", 0 if limit == 1 else 64 * 128)
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


def test_small_chunks_row_by_row_match_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    row_by_row = _logits(_runner(), 16, monkeypatch)
    sdpa = _logits(_runner(), 1, monkeypatch)
    for got, want in zip(row_by_row, sdpa, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert row_by_row[2].shape[0] == 2  # the mid-prompt chunk that ends the prompt samples too
