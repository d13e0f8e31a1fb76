"""Engine fixtures: a tiny random Llama (2 layers, 64 wide) behind the real runner, scheduler and loop.

It loads in milliseconds and runs a step in about one, so unit tests exercise the true engine path
(paged KV, flat batches, the device thread, async streams) without the real weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from llama_helpers import random_llama_weights

from homeai.core.block_manager import BlockManager
from homeai.engine.device_loop import run_alone
from homeai.engine.llm_engine import LLMEngine
from homeai.engine.model_runner import ModelRunner
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.runtime.llama_config import LlamaConfig
from homeai.scheduling.fcfs import FCFSScheduler

TINY_VOCAB = 128


class LetterTokenizer:
    """Token i decodes to one letter: enough for the detokenizer and stop strings."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in token_ids)


def tiny_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=512,
                       tie_word_embeddings=True)


def tiny_weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    return random_llama_weights(cfg, seed)


EngineFactory = Callable[..., LLMEngine]


@pytest.fixture(scope="session")
def tiny_model() -> LlamaModel:
    cfg = tiny_config()
    return LlamaModel(cfg, tiny_weights(cfg), torch.device("cpu"), torch.float32)


def build_tiny_engine(model: LlamaModel, num_blocks: int = 64, block_size: int = 4,
                      max_num_batched_tokens: int = 32, max_num_seqs: int = 8,
                      prefix_caching: bool = False) -> LLMEngine:
    """A complete engine (not started) over ``model`` with its own KV pool and FCFS scheduler."""
    cfg = model.cfg
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching, model="tiny")
    cache = KVCache(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                    model.device, model.kv_dtype)
    scheduler = FCFSScheduler(bm, max_num_batched_tokens, max_num_seqs)
    return LLMEngine(ModelRunner(model, cache), scheduler, LetterTokenizer(), [],
                     cfg.max_position_embeddings)


@pytest.fixture
def make_engine(tiny_model: LlamaModel) -> EngineFactory:
    """Factory for a fresh engine with a chosen pool size (drive it with ``engine.step()``)."""
    return lambda **kw: build_tiny_engine(tiny_model, **kw)


@pytest.fixture(scope="session")
def small_engine(tiny_model: LlamaModel) -> Iterator[LLMEngine]:
    """One started engine shared by the async tests; each test leaves it empty (assert_engine_empty)."""
    engine = build_tiny_engine(tiny_model)
    loop = run_alone(engine)
    yield engine
    loop.shutdown()
