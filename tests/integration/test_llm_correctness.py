"""Our engine on the real SmolLM2-135M (fp32, CPU) against transformers, and against itself in company.

(a) logits of prefills and 16 decode steps match ``LlamaForCausalLM`` loaded from the same folder, in
a batch mixing lengths and with a prompt prefilled in chunks; (b, c) a request's greedy and seeded
outputs do not depend on its batch neighbours; (d) preemption does not change an output; (e) the async
engine: add/abort at any moment, stop strings, max_tokens, the chat template.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import assert_engine_empty
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase
from waiting import await_until

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import FinishReason, SamplingParams, StepOutput
from homeai.engine.builder import EngineConfig, build_llm_engine, chat_prompt_ids, load_tokenizer
from homeai.engine.device_loop import run_alone
from homeai.engine.llm_engine import LLMEngine
from homeai.engine.model_runner import ModelRunner
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.scheduling.fcfs import FCFSScheduler

pytestmark = pytest.mark.slow
LOGITS_ATOL = 1e-3  # max |ours - transformers| over every logit; measured about 6e-5 in fp32

TEXTS = [
    "The quick brown fox", "In a small village by the sea, there lived an old fisherman who every morning",
    "Water boils at", "List three uses of a paperclip: 1.", "The capital of Japan is",
    "def fibonacci(n):", "Once upon a time", "My favourite recipe for pancakes starts with",
    "The three primary colours are", "Translate to French: good morning", "A haiku about autumn:",
    "Photosynthesis is the process by which", "Dear diary, today I", "2 + 2 =",
    "The best way to learn a language is", "Turn off the kitchen lights and",
]


@pytest.fixture(scope="module")
def folder(pulled_models: dict[str, Path]) -> Path:
    torch.set_num_threads(2)
    return pulled_models["smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def model(folder: Path) -> LlamaModel:
    return LlamaModel.from_folder(folder, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    return [tokenizer(t).input_ids for t in TEXTS]


def make_stack(model: LlamaModel, num_blocks: int = 128, block_size: int = 16,
               budget: int = 512) -> tuple[FCFSScheduler, ModelRunner]:
    cfg = model.cfg
    bm = BlockManager(num_blocks, block_size)
    cache = KVCache(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.device,
                    model.kv_dtype)
    return FCFSScheduler(bm, budget, 64), ModelRunner(model, cache)


def run(model: LlamaModel, arrivals: list[tuple[int, list[int], SamplingParams]],
        **stack: Any) -> tuple[list[Sequence], FCFSScheduler]:
    """Drive scheduler + runner; request i joins at step ``arrivals[i][0]``. Returns them in order."""
    sched, runner = make_stack(model, **stack)
    seqs = [Sequence(i, f"r{i}", p, sp) for i, (_, p, sp) in enumerate(arrivals)]
    step = 0
    while step == 0 or sched.has_work() or any(a[0] >= step for a in arrivals):
        for (at, _, _), seq in zip(arrivals, seqs, strict=True):
            if at == step:
                sched.add(seq)
        plan = sched.schedule()
        sched.update(plan, runner.execute(plan, sched.seqs))
        sched.block_manager.check_conserved()
        step += 1
    assert_engine_empty(sched)
    return seqs, sched


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


# ---- (a) logits against transformers --------------------------------------------------------------

def teacher_logits(model: LlamaModel, prompts: list[list[int]], join_at: list[int],
                   budget: int) -> tuple[dict[int, dict[int, torch.Tensor]], list[Sequence]]:
    """Run greedy prefill + 16 decodes, keeping the logits of every position of every sequence."""
    sched, runner = make_stack(model, budget=budget)
    seqs = [Sequence(i, f"r{i}", p, greedy(17)) for i, p in enumerate(prompts)]
    got: dict[int, dict[int, torch.Tensor]] = {i: {} for i in range(len(prompts))}
    step = 0
    while step <= max(join_at) or sched.has_work():
        for seq, at in zip(seqs, join_at, strict=True):
            if at == step:
                sched.add(seq)
        plan = sched.schedule()
        batch = runner.prepare(plan, sched.seqs)
        rows = torch.arange(batch.input_ids.shape[0])
        logits = model(batch.input_ids, batch.positions, batch.meta, runner.cache, rows)
        offset, sampled = 0, {}
        for c in plan.chunks:
            for j in range(c.num_tokens):
                got[c.seq_id][c.start + j] = logits[offset + j]
            offset += c.num_tokens
            if c.sample:
                sampled[c.seq_id] = int(logits[offset - 1].argmax())
        sched.update(plan, StepOutput(sampled=sampled))
        step += 1
    assert_engine_empty(sched)
    return got, seqs


@pytest.fixture(scope="module")
def hf_model(folder: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize(("case", "budget"), [("mixed_lengths", 512), ("chunked_prefill", 16)])
def test_logits_match_transformers(model: LlamaModel, hf_model: LlamaForCausalLM, prompts: list[list[int]],
                                   case: str, budget: int) -> None:
    if case == "mixed_lengths":  # four lengths prefill in one step; a fifth joins the decodes later
        chosen, join_at = [prompts[i] for i in (0, 1, 2, 3, 11)], [0, 0, 0, 0, 3]
    else:  # a long prompt split into chunks of <= 16 tokens while a short one decodes beside it
        long_prompt = [t for p in prompts[1:] for t in p]  # about 100 tokens
        chosen, join_at = [prompts[2], long_prompt], [0, 1]
        assert len(long_prompt) > 3 * budget
    got, seqs = teacher_logits(model, chosen, join_at, budget)
    for seq in seqs:
        tokens = seq.prompt_token_ids + seq.output_token_ids[:16]  # 16 decode steps after the prefill
        assert sorted(got[seq.seq_id]) == list(range(len(tokens)))
        ours = torch.stack([got[seq.seq_id][p] for p in range(len(tokens))])
        with torch.no_grad():
            ref = hf_model(torch.tensor([tokens])).logits[0].float()
        diff = (ours - ref).abs().max().item()
        assert diff < LOGITS_ATOL, f"seq {seq.seq_id}: max |diff| {diff:.2e}"
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))


# ---- (b, c, d) outputs independent of neighbours and of preemption --------------------------------

def crowd(prompts: list[list[int]], target: SamplingParams) -> list[tuple[int, list[int], SamplingParams]]:
    """The target (request 0) at step 2 among 15 others that join at steps 0..9 and leave at different
    steps; half of them sample with their own seeds, so the batch mixes greedy and sampled rows."""
    arrivals = [(2, prompts[0], target)]
    for i in range(1, 16):
        sp = SamplingParams(temperature=0.0 if i % 2 else 1.0, seed=i, max_tokens=3 + (i * 7) % 19,
                            ignore_eos=True)
        arrivals.append(((i * 3) % 10, prompts[i], sp))
    return arrivals


@pytest.mark.parametrize("params", [greedy(24), SamplingParams(temperature=0.8, seed=7, max_tokens=24,
                                                               ignore_eos=True)],
                         ids=["greedy", "seeded_t0.8"])
def test_output_is_the_same_alone_and_among_15_others(model: LlamaModel, prompts: list[list[int]],
                                                       tokenizer: PreTrainedTokenizerBase,
                                                       params: SamplingParams) -> None:
    (alone,), _ = run(model, [(0, prompts[0], params)])
    crowded, sched = run(model, crowd(prompts, params), budget=64)  # budget 64 also chunks prefills
    assert len(alone.output_token_ids) == 24
    assert crowded[0].output_token_ids == alone.output_token_ids
    assert tokenizer.decode(crowded[0].output_token_ids) == tokenizer.decode(alone.output_token_ids)


def test_preempted_request_matches_an_unpreempted_run(model: LlamaModel, prompts: list[list[int]]) -> None:
    arrivals = [(0, prompts[i], greedy(16)) for i in (1, 3, 7)]
    reference, sched = run(model, arrivals, num_blocks=64, block_size=4)
    assert sched.num_preemptions == 0
    # 16 blocks of 4 = 64 slots for three sequences growing to 32, 27 and 23 tokens: preemption.
    squeezed, sched = run(model, arrivals, num_blocks=16, block_size=4)
    assert sched.num_preemptions > 0 and any(s.num_preemptions for s in squeezed)
    for ref, got in zip(reference, squeezed, strict=True):
        assert got.output_token_ids == ref.output_token_ids


# ---- (e) the async engine --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[LLMEngine]:
    eng = build_llm_engine(folder, EngineConfig(device="cpu", dtype="float32", quantization="none",
                                                kv_cache_mb=48, max_num_batched_tokens=128))
    loop = run_alone(eng)
    yield eng
    loop.shutdown()


async def collect(engine: LLMEngine, ids: list[int], params: SamplingParams,
                  request_id: str | None = None) -> tuple[str, list[int], FinishReason | None]:
    text, tokens, reason = "", [], None
    async for delta in engine.generate(ids, params, request_id):
        text, reason = text + delta.text, delta.finish_reason
        tokens += delta.token_ids
    return text, tokens, reason


async def wait_idle(engine: LLMEngine) -> None:
    """Until the device thread has applied everything posted to it (the last aborts, say)."""
    await await_until(engine.is_idle, what="the engine to go idle")


async def test_chat_template_answers_capital_of_france(engine: LLMEngine) -> None:
    ids = chat_prompt_ids(engine.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    text, tokens, reason = await collect(engine, ids, SamplingParams(temperature=0.0, max_tokens=24))
    assert "Paris" in text
    assert reason in (FinishReason.STOP, FinishReason.LENGTH) and len(tokens) <= 24
    await wait_idle(engine)
    assert_engine_empty(engine)


async def test_max_tokens_and_stop_strings(engine: LLMEngine, prompts: list[list[int]]) -> None:
    text, tokens, reason = await collect(engine, prompts[6], greedy(12))
    assert reason == FinishReason.LENGTH and len(tokens) == 12
    words = text.split()
    stop = words[len(words) // 2]
    cut, _, reason = await collect(engine, prompts[6], SamplingParams(0.0, max_tokens=12, ignore_eos=True,
                                                                      stop=[stop]))
    assert reason == FinishReason.STOP
    assert cut == text[:text.index(stop)]
    await wait_idle(engine)
    assert_engine_empty(engine)


async def test_add_and_abort_at_any_moment(engine: LLMEngine, prompts: list[list[int]]) -> None:
    """16 clients arrive while others stream, each once its predecessor has had a random 0-3 deltas (moments
    counted in the engine's own steps, not in seconds); every third is aborted after a random 0-6 of its
    tokens (0: posted right behind its submission), long before its 200; some leave their
    stream after two tokens. Every abort is applied within a step of being posted, and the pool ends full."""
    rng = random.Random(11)
    sched = engine.scheduler
    posted: dict[str, int] = {}
    applied: dict[str, int] = {}
    real_abort = sched.abort
    num_clients = 16
    arrives_after = [0] + [rng.randint(0, 3) for _ in range(num_clients - 1)]  # deltas of the client before
    max_tokens = [200 if i % 3 == 0 else rng.randint(3, 14) for i in range(num_clients)]
    abort_after = [rng.randint(0, 6) if i % 3 == 0 else None for i in range(num_clients)]
    arrived = [asyncio.Event() for _ in range(num_clients)]
    arrived[0].set()

    def recording_abort(request_id: str) -> Sequence | None:
        seq = real_abort(request_id)
        if seq is not None:
            applied[request_id] = engine.stats.num_steps
            assert sched.block_manager.block_table(seq.seq_id) == []
        return seq

    def abort(request_id: str) -> None:
        posted[request_id] = engine.stats.num_steps
        engine.abort(request_id)

    def let_in_after(i: int, num_deltas: int) -> None:
        if i + 1 < num_clients and num_deltas >= arrives_after[i + 1]:
            arrived[i + 1].set()

    async def client(i: int) -> FinishReason | None:
        await arrived[i].wait()
        rid, reason, num_deltas = f"client-{i}", None, 0
        if abort_after[i] == 0:  # posted right behind the request, once generate() has submitted it
            asyncio.get_running_loop().call_soon(abort, rid)
        let_in_after(i, 0)
        try:
            async with contextlib.aclosing(engine.generate(prompts[i], greedy(max_tokens[i]), rid)) as stream:
                async for delta in stream:
                    num_deltas += 1
                    reason = delta.finish_reason
                    let_in_after(i, num_deltas)
                    if delta.finished:
                        break
                    if abort_after[i] and delta.num_output_tokens >= abort_after[i] and rid not in posted:
                        abort(rid)  # ignore_eos and 200 tokens: it is still running
                    if i % 5 == 4 and delta.num_output_tokens >= 2:  # a client that goes away: leaving aborts
                        return None
        finally:
            if i + 1 < num_clients:
                arrived[i + 1].set()  # however this client ended, the next one comes
        return reason

    sched.abort = recording_abort  # type: ignore[method-assign]
    try:
        reasons = await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(num_clients))), 90)
        await wait_idle(engine)
    finally:
        del sched.abort
    assert FinishReason.ABORT in reasons and FinishReason.LENGTH in reasons
    assert all(reasons[i] == FinishReason.ABORT for i in range(num_clients) if abort_after[i] is not None
               and i % 5 != 4)  # (one that also leaves may be gone first)
    for rid, step in applied.items():
        if rid in posted:
            assert step - posted[rid] <= 1, f"{rid}: abort applied {step - posted[rid]} steps late"
    assert_engine_empty(engine)
