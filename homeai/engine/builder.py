"""Builds a ready engine from a model folder: weights, tokenizer, KV pool sized from a memory budget."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from homeai.core.block_manager import BlockManager
from homeai.engine.llm_engine import LLMEngine
from homeai.engine.model_runner import ModelRunner
from homeai.runtime.decode_graph import CompiledDecode, compile_mode_from_env, should_compile
from homeai.runtime.device import choose_device, in_passing_thread, parse_dtype
from homeai.runtime.fast_tokenizer import load_fast_tokenizer
from homeai.runtime.grammar import GrammarCache
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.runtime.weights_format import choose_weights_format
from homeai.scheduling.fcfs import FCFSScheduler
from homeai.scheduling.interface import StepScheduler

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineConfig:
    device: str | None = None
    dtype: str | None = None
    # "auto" (the fastest lossless format: homeai.runtime.weights_format), "none", "int8" per-channel,
    # "int4" groups of 32 (CPU): homeai.runtime.quant
    quantization: str = "auto"
    kv_cache_mb: int = 256
    enable_prefix_caching: bool = True  # keep finished prompts' KV blocks for reuse (see BlockManager)
    block_size: int = 16
    max_model_len: int = 2048
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    # "auto" | "on" | "off": decode steps through torch.compile (runtime/decode_graph); default from the env
    compile_decode: str = field(default_factory=compile_mode_from_env)
    cache_dir: Path | None = None  # where Inductor keeps compiled code between starts


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The folder's fast tokenizer (tokenizer.json: every GGUF or Ollama pull writes one) without
    AutoTokenizer, whose import alone keeps ~95 MB resident; AutoTokenizer for folders without one."""
    if (folder / "tokenizer.json").is_file():
        return load_fast_tokenizer(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def eos_ids(folder: Path, model: LlamaModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = set(model.cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def build_llm_engine(folder: Path, config: EngineConfig | None = None,
                     scheduler: StepScheduler | None = None) -> LLMEngine:
    """Load the model and size the KV pool; ``scheduler`` defaults to FCFS continuous batching. Loads in a
    thread of its own, so the device thread's OpenMP pool stays the only one (see ``in_passing_thread``)."""
    return in_passing_thread(_build_llm_engine, folder, config, scheduler)


def _build_llm_engine(folder: Path, config: EngineConfig | None, scheduler: StepScheduler | None) -> LLMEngine:
    cfg = config or EngineConfig()
    t0 = time.perf_counter()
    device = choose_device(cfg.device)
    dtype = parse_dtype(cfg.dtype, device)
    weights = choose_weights_format(cfg.quantization, folder, device)
    model = LlamaModel.from_folder(folder, device, dtype, weights.quantization)
    mc = model.cfg
    per_block = KVCache.bytes_per_block(mc.num_layers, cfg.block_size, mc.num_kv_heads, mc.head_dim, model.kv_dtype)
    num_blocks = max(1, cfg.kv_cache_mb * 2**20 // per_block)
    cache = KVCache(mc.num_layers, num_blocks, cfg.block_size, mc.num_kv_heads, mc.head_dim, device, model.kv_dtype)
    block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching, model=folder.name)
    if cache.prefault is not None:
        block_manager.on_block = cache.prefault.handed_out
    tokenizer = load_tokenizer(folder)
    stop_ids = eos_ids(folder, model, tokenizer)
    runner = ModelRunner(model, cache, GrammarCache(tokenizer, mc.vocab_size, stop_ids))
    if scheduler is None:
        scheduler = FCFSScheduler(block_manager, cfg.max_num_batched_tokens, cfg.max_num_seqs)
    else:
        scheduler.block_manager = block_manager
    max_len = min(cfg.max_model_len, mc.max_position_embeddings)
    if should_compile(cfg.compile_decode, device):
        runner.compiled = CompiledDecode(model, cache, max_len, cfg.max_num_seqs, cfg.cache_dir)
        runner.compiled.start()  # in the background: decode steps run eager until their bucket is ready
    engine = LLMEngine(runner, scheduler, tokenizer, stop_ids, max_len)
    engine.weights = weights
    _ = engine.tokenizer_size  # counted here, while loading, not by the first request on the event loop
    log.info("LLM %s ready on %s/%s (weights %s: %s) in %.2fs: %d KV blocks of %d tokens (%s)", folder.name,
             device, dtype, weights.quantization, weights.reason, time.perf_counter() - t0, num_blocks,
             cfg.block_size, str(model.kv_dtype).removeprefix("torch."))
    return engine


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]],
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Apply the model's own chat template (from its metadata) and return token ids; ``tools`` (OpenAI
    function definitions) only for a template with a tools section (see ``template_has_tools``)."""
    ids = tokenizer.apply_chat_template(messages, tools=[*tools] if tools else None, add_generation_prompt=True,
                                        tokenize=True)
    return list(ids)


def template_has_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders a ``tools`` variable (SmolLM2's does not)."""
    template = tokenizer.chat_template
    return isinstance(template, str) and "tools" in template
