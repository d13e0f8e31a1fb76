"""A prefix-cache hit computes what a cold run computes: the logits of every sampled step of a request
served partly from cached blocks equal those of the same request alone on a cold engine (max abs diff
<= 1e-3), for a prefix ending mid-block (copied from a published block, or the block a finished run left
taken over), for sequences sharing blocks while they run, after eviction,
and after preemption. The tiny random Llama runs the real runner, scheduler and paged cache."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import build_tiny_engine
from engine_helpers import assert_engine_empty
from llama_helpers import random_llama_weights

from homeai.core.types import SamplingParams, StepPlan
from homeai.engine.llm_engine import LLMEngine
from homeai.runtime.llama import LlamaModel
from homeai.runtime.llama_config import LlamaConfig

LOGITS_ATOL = 1e-3
BS = 4


class Recorder:
    """Wraps an engine: keeps each request's logits rows (one per sampled token) and every plan."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.logits: dict[str, list[torch.Tensor]] = {}
        self.plans: list[StepPlan] = []
        self._by_params: dict[int, str] = {}
        sampler, scheduler = engine.runner.sampler, engine.scheduler
        sample, schedule = sampler.sample, scheduler.schedule

        def recording_sample(logits: torch.Tensor, params: list[SamplingParams], *rest: Any) -> Any:
            for row, p in zip(logits, params, strict=True):
                self.logits.setdefault(self._by_params[id(p)], []).append(row.clone())
            return sample(logits, params, *rest)

        def recording_schedule() -> StepPlan:
            plan = schedule()
            self.plans.append(plan)
            return plan

        sampler.sample = recording_sample  # type: ignore[method-assign]
        scheduler.schedule = recording_schedule  # type: ignore[method-assign]

    def add(self, request_id: str, prompt: list[int], max_tokens: int = 4) -> int:
        seq = self.engine.make_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                               ignore_eos=True), request_id)
        self._by_params[id(seq.params)] = request_id
        self.engine.scheduler.add(seq)
        return seq.seq_id

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.engine.scheduler.has_work():
                return
            self.engine.step()
            self.engine.scheduler.block_manager.check_conserved()
        raise AssertionError("engine did not drain")

    def first_chunk_start(self, seq_id: int, after_step: int = 0) -> int:
        return next(c.start for p in self.plans[after_step:] for c in p.chunks if c.seq_id == seq_id)


def cold_logits(make_engine: Any, prompt: list[int], max_tokens: int = 4) -> list[torch.Tensor]:
    rec = Recorder(make_engine(num_blocks=64, block_size=BS))
    rec.add("cold", prompt, max_tokens)
    rec.run()
    return rec.logits["cold"]


def assert_same_logits(warm: list[torch.Tensor], cold: list[torch.Tensor]) -> None:
    assert len(warm) == len(cold)
    diff = max(float((w - c).abs().max()) for w, c in zip(warm, cold, strict=True))
    assert diff <= LOGITS_ATOL, f"max abs logits diff {diff}"


def tokens(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (n,), generator=g).tolist()


def hit_tokens(engine: LLMEngine) -> int:
    return sum(int(c["num_hit_tokens"]) for c in engine.scheduler.block_manager.stats.snapshot().values())


def test_a_prefix_ending_mid_block_is_reused_and_changes_no_logit(make_engine) -> None:
    system = tokens(1, 10)  # two full blocks and half of a third
    first, second = system + tokens(2, 3), system + tokens(3, 5)
    rec = Recorder(make_engine(num_blocks=64, block_size=BS, prefix_caching=True))
    rec.add("first", first)
    rec.run()
    step = len(rec.plans)
    sid = rec.add("second", second)
    rec.run()
    # two whole blocks, and the 2 slots of first's third block it shares, copied (that block is published)
    assert rec.first_chunk_start(sid, step) == 10 and hit_tokens(rec.engine) == 10
    assert [c.kv_copy[2] for p in rec.plans[step:] for c in p.chunks if c.kv_copy] == [2]
    third = system[:8] + tokens(6, 1)  # all but its last token cached: that one runs as a decode row
    step = len(rec.plans)
    sid = rec.add("third", third)
    rec.run()
    assert rec.first_chunk_start(sid, step) == 8 and hit_tokens(rec.engine) == 18
    for name, prompt in (("first", first), ("second", second), ("third", third)):
        assert_same_logits(rec.logits[name], cold_logits(make_engine, prompt))
    assert_engine_empty(rec.engine)


def test_a_repeated_prompt_computes_only_its_last_token_and_changes_no_logit(make_engine) -> None:
    prompt = tokens(11, 11)  # two full blocks and 3 tokens in a third
    rec = Recorder(make_engine(num_blocks=64, block_size=BS, prefix_caching=True))
    rec.add("first", prompt, max_tokens=1)  # its last block is written up to the prompt's end
    rec.run()
    step = len(rec.plans)
    sid = rec.add("again", prompt)
    rec.run()
    first = next(c for p in rec.plans[step:] for c in p.chunks if c.seq_id == sid)
    assert (first.start, first.num_tokens, first.kv_copy) == (10, 1, None)  # the tail block taken over
    assert_same_logits(rec.logits["again"], cold_logits(make_engine, prompt))
    assert_engine_empty(rec.engine)


def test_running_sequences_share_cached_blocks(make_engine) -> None:
    system = tokens(4, 16)
    prompts = {name: system + tokens(5 + i, 3 + i) for i, name in enumerate(("a", "b", "c"))}
    rec = Recorder(make_engine(num_blocks=64, block_size=BS, prefix_caching=True))
    ids = {"a": rec.add("a", prompts["a"], max_tokens=12)}
    rec.engine.step()  # a's prompt is computed; a keeps decoding while b and c arrive
    ids |= {n: rec.add(n, prompts[n], max_tokens=6) for n in ("b", "c")}
    rec.engine.step()
    bm = rec.engine.scheduler.block_manager
    shared = bm.block_table(ids["a"])[:4]
    assert bm.block_table(ids["b"])[:4] == shared and bm.block_table(ids["c"])[:4] == shared
    rec.run()
    assert hit_tokens(rec.engine) == 32
    for name, prompt in prompts.items():
        assert_same_logits(rec.logits[name], cold_logits(make_engine, prompt, 12 if name == "a" else 6))
    assert_engine_empty(rec.engine)


def test_after_eviction_the_remaining_head_of_a_prefix_is_still_right(make_engine) -> None:
    system = tokens(8, 24)
    rec = Recorder(make_engine(num_blocks=16, block_size=BS, max_num_batched_tokens=64, prefix_caching=True))
    rec.add("first", system, max_tokens=1)  # 24 tokens computed: 6 full blocks published
    rec.run()
    rec.add("filler", tokens(9, 48), max_tokens=1)  # 12 blocks: the 10 free ones, then first's last 2
    rec.run()
    bm = rec.engine.scheduler.block_manager
    assert bm.stats.num_evictions == 2
    again = system[:20] + tokens(10, 6)
    before = hit_tokens(rec.engine)
    sid = rec.add("again", again)
    step = len(rec.plans)
    rec.run()
    found = hit_tokens(rec.engine) - before
    assert found == 16 and rec.first_chunk_start(sid, step) == 16  # the evicted 5th block is recomputed
    assert_same_logits(rec.logits["again"], cold_logits(make_engine, again))
    assert_engine_empty(rec.engine)


def test_a_preempted_sequence_re_hits_the_cache_when_it_resumes(make_engine) -> None:
    system = tokens(11, 16)
    prompts = {"a": system + tokens(12, 4), "b": system + tokens(13, 4)}
    # 12 blocks: each needs 10 at its end (4 shared), so b is preempted while a decodes.
    rec = Recorder(make_engine(num_blocks=12, block_size=BS, max_num_batched_tokens=64, prefix_caching=True))
    ids = {n: rec.add(n, p, max_tokens=20) for n, p in prompts.items()}
    rec.run()
    preempted_at = [i for i, p in enumerate(rec.plans) if ids["b"] in p.preempted]
    assert preempted_at, "the pool was meant to force a preemption"
    assert rec.first_chunk_start(ids["b"], preempted_at[0] + 1) >= 16  # resumed after its cached prefix
    for name, prompt in prompts.items():
        assert_same_logits(rec.logits[name], cold_logits(make_engine, prompt, 20))
    assert_engine_empty(rec.engine)


@pytest.mark.parametrize("quantization", ["none", "int4"])
def test_a_prompt_cached_whole_answers_exactly_as_cold_where_the_prefill_kernel_serves(quantization: str) -> None:
    """A prompt found whole in the prefix cache computes its last token alone. That token went through the
    decode kernel (float32 over the cache) where a quantized model's prompts attend in bfloat16 pairs: the
    same greedy request answered differently once its prompt was cached (SmolLM2 int4: logits 0.83 apart).
    It now goes the prompt's way, whose rows do not depend on the chunking: the logits are the same bits."""
    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2,
                      num_kv_heads=1, head_dim=64, max_position_embeddings=512, tie_word_embeddings=True)
    model = LlamaModel(cfg, random_llama_weights(cfg, seed=3), torch.device("cpu"), torch.float32, quantization)
    if model.prefill_attention is None:
        pytest.skip("no native prefill kernel on this CPU: prompt tails keep the decode kernel")
    prompt = tokens(11, 37)
    cold = Recorder(build_tiny_engine(model, num_blocks=64, block_size=BS))
    cold.add("cold", prompt, 6)
    cold.run()
    warm = Recorder(build_tiny_engine(model, num_blocks=64, block_size=BS, prefix_caching=True))
    for name in ("first", "again"):
        warm.add(name, prompt, 6)
        warm.run()
    assert sum(c.num_tokens for p in warm.plans for c in p.chunks if c.start < len(prompt)) == len(prompt) + 1
    for w, c in zip(warm.logits["again"], cold.logits["cold"], strict=True):
        assert torch.equal(w, c)
    assert_engine_empty(warm.engine)
