"""How far a quantized model strays from its float32 original: greedy agreement and logit distance.

Both a slow test (a few prompts) and ``homeai bench quant`` (50 prompts x 32 tokens, the figure the
README reports) call these, so the test checks the same thing the bench reports.

- free-running agreement: both models generate greedily on their own; the share of positions where
  the two token streams are equal (strict: after a first divergence the rest rarely matches).
- teacher-forced agreement: the quantized model predicts each next token of the float32 model's
  stream; the share it gets equal (how often one step's argmax differs, the usual figure).
- logit distance at those positions: max |a - b| relative to the float32 logits' standard deviation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams
from homeai.engine.builder import chat_prompt_ids
from homeai.engine.model_runner import ModelRunner
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import AttentionMetadata, LlamaModel, PrefillChunk
from homeai.scheduling.fcfs import FCFSScheduler

QUALITY_WORDS = ("the house light kitchen music evening garden window quiet river morning story small "
                 "bright remember tomorrow water coffee train city friend letter winter summer recipe bread "
                 "green question answer machine careful simple because under between always never").split()


@dataclass(slots=True)
class Agreement:
    num_tokens: int
    free_running: float
    teacher_forced: float
    max_rel_logit_diff: float  # max |quantized - float| / std(float logits), over every compared row

    def as_dict(self) -> dict[str, float]:
        return {"num_tokens": self.num_tokens, "free_running": self.free_running,
                "teacher_forced": self.teacher_forced, "max_rel_logit_diff": self.max_rel_logit_diff}


TOPICS = ("the moon|bread baking|a quiet garden|winter mornings|trains in Europe|coffee|how rain forms|"
          "a friendly dog|saving energy at home|learning French|the kitchen lights|a birthday party|"
          "volcanoes|the history of tea|bicycles|a rainy weekend|owls|recycling|the ocean tides|chess").split("|")
ASKS = ("Tell me about {}.", "Write two sentences about {}.", "What should a child know about {}?")


def chat_prompts(tokenizer: PreTrainedTokenizerBase, n: int) -> list[list[int]]:
    """``n`` short household chat turns through the model's chat template (fixed, the same every run)."""
    turns = [ask.format(topic) for ask in ASKS for topic in TOPICS][:n]
    return [chat_prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in turns]


def word_prompts(tokenizer: PreTrainedTokenizerBase, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` chat-free prompts of 8..40 random words from a fixed seed (the same every run)."""
    rng = random.Random(seed)
    return [tokenizer(" ".join(rng.choice(QUALITY_WORDS) for _ in range(rng.randint(8, 40)))).input_ids
            for _ in range(n)]


def generate_greedy(model: LlamaModel, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """Greedy continuations of every prompt, batched through the engine's scheduler and runner."""
    cfg = model.cfg
    block_size = 16
    num_blocks = sum(-(-(len(p) + num_tokens) // block_size) for p in prompts) + 1
    bm = BlockManager(num_blocks, block_size)
    cache = KVCache(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.device,
                    model.kv_dtype)
    sched, runner = FCFSScheduler(bm, 2048, len(prompts)), ModelRunner(model, cache)
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    seqs = [Sequence(i, f"q{i}", p, params) for i, p in enumerate(prompts)]
    for seq in seqs:
        sched.add(seq)
    while sched.has_work():
        plan = sched.schedule()
        sched.update(plan, runner.execute(plan, sched.seqs))
    return [list(s.output_token_ids) for s in seqs]


DECODE_ROWS = 16  # continuation tokens per forward pass: decode-sized, so the decode kernels run


def stream_logits(model: LlamaModel, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """Logits [1 + len(continuation), vocab] (float32) that predicted each token after the prompt, computed
    the way serving computes them: the prompt in one prefill chunk, then the continuation over the cached
    prompt in chunks of ``DECODE_ROWS`` tokens, which take the same kernels as decode steps (on the CPU
    the int8 kernel differs between decode-sized and prompt-sized inputs)."""
    cfg, dev = model.cfg, model.device
    n = len(prompt) + len(continuation)
    cache = KVCache(cfg.num_layers, -(-n // 16), 16, cfg.num_kv_heads, cfg.head_dim, dev, model.kv_dtype)
    ids = torch.tensor(prompt + continuation, device=dev)
    p = len(prompt)
    rows = torch.arange(p, device=dev)
    meta = AttentionMetadata(slot_mapping=rows, prefills=[PrefillChunk(0, p, None, None)])
    out = [model(ids[:p], rows, meta, cache, rows[-1:])]
    for start in range(p, n, DECODE_ROWS):
        end = min(n, start + DECODE_ROWS)
        rows = torch.arange(start, end, device=dev)
        context = torch.arange(end, device=dev)
        mask = context[None, :] <= rows[:, None]  # causal over the prompt and the chunk so far
        chunk = PrefillChunk(0, end - start, context, mask)
        meta = AttentionMetadata(slot_mapping=rows, prefills=[chunk])
        out.append(model(ids[start:end], rows, meta, cache, torch.arange(end - start, device=dev)))
    return torch.cat(out).float().cpu()


def measure_agreement(reference: LlamaModel, candidate: LlamaModel, prompts: list[list[int]],
                      num_tokens: int) -> Agreement:
    """Compare ``candidate`` with ``reference`` over ``num_tokens`` greedy tokens per prompt."""
    ref_out = generate_greedy(reference, prompts, num_tokens)
    cand_out = generate_greedy(candidate, prompts, num_tokens)
    total = len(prompts) * num_tokens
    free = sum(a == b for ra, ca in zip(ref_out, cand_out, strict=True) for a, b in zip(ra, ca, strict=True))
    forced, worst = 0, 0.0
    for prompt, out in zip(prompts, ref_out, strict=True):
        ref_logits = stream_logits(reference, prompt, out[:-1])  # the rows that predicted each output token
        cand_logits = stream_logits(candidate, prompt, out[:-1])
        forced += int((cand_logits.argmax(-1) == torch.tensor(out)).sum())
        rel = (cand_logits - ref_logits).abs().amax(-1) / ref_logits.std(-1)
        worst = max(worst, float(rel.max()))
    return Agreement(total, free / total, forced / total, worst)
