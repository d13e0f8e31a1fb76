"""Every weight format, eager and compiled, through every step shape the scheduler can plan.

Hypothesis draws step plans (decode-only steps of 1 row, of a compiled bucket's size, padded into one,
and above the largest bucket; mixed steps; prompt-only steps with and without a sampled row; a 1-token
chunk in mid-prompt, as a prefix-cache hit or a nearly full KV pool leaves; prompts longer than any
one step; requests of a single output token) and drives each through the real ModelRunner of every
format, beside float32 eager on the same weights: the logits of every sampled row must match within the
format's tolerance, and no step may raise. A prefix the cache reuses inside a block (copied, or taken
over) goes through every format too. The model is a small random Llama of real head size (64, so the
native decode-attention kernel serves it as it serves SmolLM2), loaded in milliseconds. Where a CUDA
device is present (``gpu`` marker; ``deploy/gpu-check/check.sh tests``) the same plans go through bfloat16
and int8 on it, eager and compiled, against float32 eager on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llama_helpers import random_llama_weights

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams, ScheduledChunk, StepPlan
from homeai.engine.model_runner import BatchInputs, ModelRunner
from homeai.runtime.decode_graph import CompiledDecode
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.runtime.llama_config import LlamaConfig

VOCAB = 256
BLOCK = 4
NUM_BLOCKS = 160
COMPILED_BUCKETS = (1, 4)  # a 1-row step, 2-3 rows padded into 4, 5+ rows above the largest: eager
# Largest |logit difference| against float32 eager, as a share of the largest |logit| of the row set:
# compiled float32 reorders float sums only; int8 rounds each weight to 1/254 of its row's range and int4
# to 1/15 of its group's (random weights have no structure to spare, so these bound real models' error).
TOLERANCE = {"none": 1e-4, "int8": 0.05, "int4": 0.25}


def small_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2,
                       num_kv_heads=1, head_dim=64, max_position_embeddings=512, tie_word_embeddings=True)


def small_weights(cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    return random_llama_weights(cfg, seed=7, scale=0.08, embed_scale=10)


@dataclass
class Stack:
    """One format's model behind its own KV pool and the real runner."""

    name: str
    runner: ModelRunner
    block_manager: BlockManager

    @classmethod
    def build(cls, quantization: str, compiled: bool, cache_dir: Path, device: str = "cpu",
              dtype: torch.dtype = torch.float32) -> Stack:
        cfg = small_config()
        model = LlamaModel(cfg, small_weights(cfg), torch.device(device), dtype, quantization)
        bm = BlockManager(NUM_BLOCKS, BLOCK)
        cache = KVCache(cfg.num_layers, NUM_BLOCKS, BLOCK, cfg.num_kv_heads, cfg.head_dim, model.device, model.kv_dtype)
        runner = ModelRunner(model, cache)
        if compiled:
            runner.compiled = CompiledDecode(model, cache, max_model_len=256, max_batch=COMPILED_BUCKETS[-1],
                                             cache_dir=cache_dir, buckets=COMPILED_BUCKETS)
            for bucket in runner.compiled.buckets:
                assert runner.compiled.compile_bucket(bucket), runner.compiled.failed
        return cls(f"{quantization}{'-compiled' if compiled else ''}{'' if device == 'cpu' else '-' + device}",
                   runner, bm)

    def logits(self, plan: StepPlan, seqs: dict[int, Sequence]) -> torch.Tensor:
        """The sampled rows' logits of ``plan``, through the runner's own prepare and forward."""
        for chunk in plan.chunks:  # this stack's blocks (a scheduler's seal() does the same)
            self.block_manager.allocate(chunk.seq_id, chunk.start + chunk.num_tokens)
            chunk.block_table = self.block_manager.block_table(chunk.seq_id)
        logits, _ = self.runner._forward(self.runner.prepare(plan, seqs))
        return logits.float().cpu()

    def forget(self, seqs: dict[int, Sequence]) -> None:
        for seq_id in seqs:
            self.block_manager.free(seq_id)


VARIANTS = [(q, c) for q in ("none", "int8", "int4") for c in (False, True)]
# On CUDA the weights and activations are bfloat16 (int4 runs on the CPU only); against float32 eager on
# the CPU, each op's output rounded to 8 bits of mantissa, the int8 rounding on top.
CUDA_VARIANTS = [(q, c) for q in ("none", "int8") for c in (False, True)]
CUDA_TOLERANCE = {"none": 0.05, "int8": 0.08}


@pytest.fixture(scope="module")
def stacks(homeai_cache_dir: Path) -> dict[str, Stack]:
    torch.manual_seed(0)
    built = [Stack.build(q, c, homeai_cache_dir) for q, c in [("none", False), *VARIANTS[1:]]]
    return {s.name: s for s in built}


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[list[int], int]]:
    """1-9 requests: a prompt of 1-70 tokens (longer than most steps take at once) and 1-4 output tokens."""
    n = draw(st.integers(1, 9))
    return [(draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=70)), draw(st.integers(1, 4)))
            for _ in range(n)]


@pytest.fixture(scope="module")
def cuda_stacks(homeai_cache_dir: Path) -> dict[str, Stack]:
    built = [Stack.build(q, c, homeai_cache_dir, "cuda", torch.bfloat16) for q, c in CUDA_VARIANTS]
    return {s.name: s for s in built}


@pytest.mark.parametrize(("quantization", "compiled"), VARIANTS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(work=workloads(), data=st.data())
def test_every_step_shape_matches_float32_eager(stacks: dict[str, Stack], quantization: str, compiled: bool,
                                                work: list[tuple[list[int], int]], data: st.DataObject) -> None:
    under_test = stacks[f"{quantization}{'-compiled' if compiled else ''}"]
    drive_steps(stacks["none"], under_test, work, data, TOLERANCE[quantization])


@pytest.mark.gpu
@pytest.mark.parametrize(("quantization", "compiled"), CUDA_VARIANTS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(work=workloads(), data=st.data())
def test_every_step_shape_on_cuda_matches_float32_eager(stacks: dict[str, Stack], cuda_stacks: dict[str, Stack],
                                                        quantization: str, compiled: bool,
                                                        work: list[tuple[list[int], int]],
                                                        data: st.DataObject) -> None:
    under_test = cuda_stacks[f"{quantization}{'-compiled' if compiled else ''}-cuda"]
    drive_steps(stacks["none"], under_test, work, data, CUDA_TOLERANCE[quantization])


def drive_steps(ref: Stack, under_test: Stack, work: list[tuple[list[int], int]], data: st.DataObject,
                tolerance: float) -> None:
    """Drawn step plans until every request has its tokens; each step's sampled logits within
    ``tolerance`` of float32 eager's (as a share of their largest magnitude)."""
    seqs = {i: Sequence(i, f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=out))
            for i, (prompt, out) in enumerate(work)}
    computed = dict.fromkeys(seqs, 0)
    try:
        while active := [i for i, s in seqs.items() if len(s.output_token_ids) < s.params.max_tokens]:
            # Half the steps that can be decode-only are (what compiled buckets serve); the rest mix freely.
            decodes = [i for i in active if seqs[i].num_tokens - computed[i] == 1]
            pool = decodes if decodes and data.draw(st.booleans(), label="decode-only") else active
            picked = data.draw(st.lists(st.sampled_from(pool), min_size=1, unique=True), label="step")
            plan = StepPlan()
            for i in sorted(picked):
                seq = seqs[i]
                pending = seq.num_tokens - computed[i]
                n = 1 if pending == 1 else data.draw(st.integers(1, pending), label=f"chunk of {i}")
                plan.chunks.append(ScheduledChunk(i, computed[i], n, sample=computed[i] + n == seq.num_tokens))
            want, got = ref.logits(plan, seqs), under_test.logits(plan, seqs)
            sampled = [c for c in plan.chunks if c.sample]
            assert got.shape == want.shape == (len(sampled), VOCAB)
            if sampled:
                scale = want.abs().max().item()
                diff = (got - want).abs().max().item()
                assert diff <= tolerance * scale, f"{under_test.name}: {diff:.4g} vs scale {scale:.3g}"
            for chunk in plan.chunks:
                computed[chunk.seq_id] += chunk.num_tokens
            for chunk, token in zip(sampled, want.argmax(-1).tolist(), strict=True):  # both follow float32
                seqs[chunk.seq_id].output_token_ids.append(token)
    finally:
        ref.forget(seqs)
        under_test.forget(seqs)


@pytest.mark.parametrize(("quantization", "compiled"), VARIANTS)
def test_a_prefix_reused_inside_a_block_matches_float32_eager(stacks: dict[str, Stack], quantization: str,
                                                              compiled: bool) -> None:
    """The prefix cache's two shapes inside a block, in every format: a prompt sharing 6 tokens with one
    computed before (its first block found whole, 2 slots of the second copied, the rest a prompt chunk),
    then the first prompt again (its partly written last block taken over: only its last token runs, a
    one-row step: through the prompt's kernel where the native prefill kernel serves, so it computes what the
    cold prompt computed, else as a decode row, compiled where the variant compiles). Logits as float32
    eager computing each cold."""
    ref, under_test = stacks["none"], stacks[f"{quantization}{'-compiled' if compiled else ''}"]
    bm = BlockManager(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)  # the stack's own pool holds nothing now
    first = list(range(10, 21))  # 11 tokens: two full blocks and 3 tokens in a third
    second = first[:6] + [60, 61, 62]

    def warm(seq_id: int, prompt: list[int]) -> tuple[ScheduledChunk, torch.Tensor]:
        seq = Sequence(seq_id, f"r{seq_id}", prompt, SamplingParams(temperature=0.0, max_tokens=1))
        cached = bm.lookup(seq)
        seq.num_computed_tokens = bm.admit(seq, seq.num_tokens - cached)
        chunk = ScheduledChunk(seq_id, cached, seq.num_tokens - cached, sample=True,
                               block_table=bm.block_table(seq_id), kv_copy=bm.take_copy(seq_id))
        plan = StepPlan([chunk])
        under_test.runner.copy_reused_kv(plan)  # as execute() does before prepare
        logits, _ = under_test.runner._forward(under_test.runner.prepare(plan, {seq_id: seq}))
        seq.num_computed_tokens = seq.num_tokens
        bm.cache_blocks(seq)
        bm.release_pins()
        bm.free(seq_id)
        return chunk, logits

    def cold(prompt: list[int]) -> torch.Tensor:
        seqs = {0: Sequence(0, "cold", prompt, SamplingParams(temperature=0.0, max_tokens=1))}
        try:
            return ref.logits(StepPlan([ScheduledChunk(0, 0, len(prompt), sample=True)]), seqs)
        finally:
            ref.forget(seqs)

    warm(0, first)
    copied, got_second = warm(1, second)
    assert (copied.start, copied.kv_copy is not None and copied.kv_copy[2]) == (6, 2)
    before = under_test.runner.compiled_steps
    taken, got_first = warm(2, first)
    assert (taken.start, taken.num_tokens, taken.kv_copy) == (10, 1, None)
    assert under_test.runner.compiled_steps == before + (compiled and under_test.runner.model.prefill_attention is None)
    for got, want in ((got_second, cold(second)), (got_first, cold(first))):
        diff, scale = (got - want).abs().max().item(), want.abs().max().item()
        assert diff <= TOLERANCE[quantization] * scale, f"{under_test.name}: {diff:.4g} vs scale {scale:.3g}"


def test_the_compiled_variants_served_compiled_steps(stacks: dict[str, Stack]) -> None:
    """Runs after the drawn plans (file order): each compiled variant took some of its steps compiled."""
    for name, stack in stacks.items():
        if name.endswith("-compiled"):
            assert stack.runner.compiled_steps > 0, name


@pytest.mark.gpu
def test_the_compiled_cuda_variants_served_compiled_steps(cuda_stacks: dict[str, Stack]) -> None:
    for name, stack in cuda_stacks.items():
        if "-compiled" in name:
            assert stack.runner.compiled_steps > 0, name


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_small_prompt_chunks_beside_a_decode_run_eager(stacks: dict[str, Stack], quantization: str) -> None:
    """A decode row beside a 2-token chunk in mid-prompt (it samples nothing): every token is a decode row,
    but two of the three sample nothing, and a bucket computes logits for all its rows; the step runs eager
    (only the sampled row's logits: the faster path, see ``ModelRunner.prepare``). Then the decodes alone
    (both rows sample) run compiled."""
    ref, under_test = stacks["none"], stacks[f"{quantization}-compiled"]
    seqs = {0: Sequence(0, "a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=2)),
            1: Sequence(1, "b", list(range(40, 52)), SamplingParams(temperature=0.0, max_tokens=2))}
    try:
        first = StepPlan([ScheduledChunk(0, 0, 3, sample=True), ScheduledChunk(1, 0, 8, sample=False)])
        token = int(ref.logits(first, seqs).argmax(-1))
        under_test.logits(first, seqs)
        seqs[0].output_token_ids.append(token)
        mixed = StepPlan([ScheduledChunk(0, 3, 1, sample=True), ScheduledChunk(1, 8, 2, sample=False)])
        before = under_test.runner.compiled_steps
        want, got = ref.logits(mixed, seqs), under_test.logits(mixed, seqs)
        assert under_test.runner.compiled_steps == before
        assert got.shape == want.shape == (1, VOCAB)
        assert (got - want).abs().max().item() <= TOLERANCE[quantization] * want.abs().max().item()
        seqs[0].output_token_ids.append(int(want.argmax(-1)))
        rest = StepPlan([ScheduledChunk(1, 10, 2, sample=True)])  # b's prompt ends: its last token samples
        ref.logits(rest, seqs), under_test.logits(rest, seqs)
        seqs[1].output_token_ids.append(0)
        decodes = StepPlan([ScheduledChunk(0, 4, 1, sample=True), ScheduledChunk(1, 12, 1, sample=True)])
        want, got = ref.logits(decodes, seqs), under_test.logits(decodes, seqs)
        assert under_test.runner.compiled_steps == before + 1
        assert got.shape == want.shape == (2, VOCAB)
        assert (got - want).abs().max().item() <= TOLERANCE[quantization] * want.abs().max().item()
    finally:
        ref.forget(seqs)
        under_test.forget(seqs)


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_the_last_layer_runs_for_the_logits_rows_only(stacks: dict[str, Stack], quantization: str) -> None:
    """``LlamaModel.forward`` runs the last layer's attention output, o and MLP only for the rows whose
    logits a step asks for, and none of it for a step of mid-prompt chunks. Against a forward asked for
    every row (which selects nothing): a mixed step's sampled rows (a decode row, a prompt's last chunk)
    match, and a prompt computed in two chunks, the first alone in its step and sampling nothing, ends with
    the logits of the same prompt computed whole (so that step still wrote every layer's keys and values)."""
    stack = stacks[quantization]
    runner, model = stack.runner, stack.runner.model
    prompt = list(range(30, 67))  # 37 tokens
    seqs = {0: Sequence(0, "whole", prompt, SamplingParams(temperature=0.0, max_tokens=2)),
            1: Sequence(1, "chunked", prompt, SamplingParams(temperature=0.0, max_tokens=1)),
            2: Sequence(2, "decodes", [7, 8, 9], SamplingParams(temperature=0.0, max_tokens=3))}

    def prepare(plan: StepPlan) -> BatchInputs:
        for chunk in plan.chunks:
            stack.block_manager.allocate(chunk.seq_id, chunk.start + chunk.num_tokens)
            chunk.block_table = stack.block_manager.block_table(chunk.seq_id)
        return runner.prepare(plan, seqs)

    def selected_and_every(plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's logits as the runner asks for them, and a forward's for every row at those rows."""
        batch = prepare(plan)
        rows = torch.arange(batch.input_ids.shape[0])
        every = model(batch.input_ids, batch.positions, batch.meta, runner.cache, rows)  # writes the same KV
        got = model(batch.input_ids, batch.positions, batch.meta, runner.cache, batch.logits_idx)
        return got, every[batch.logits_idx]

    def close(got: torch.Tensor, want: torch.Tensor) -> None:
        # The same rows, but a quantized layer picks its kernel by row count (bfloat16 weights for many rows).
        torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE[quantization] * want.abs().max().item())

    try:
        got, want = selected_and_every(StepPlan([ScheduledChunk(0, 0, 37, sample=True),
                                                 ScheduledChunk(2, 0, 3, sample=True)]))
        assert got.shape == want.shape == (2, VOCAB)
        close(got, want)
        whole = got[0]
        seqs[2].output_token_ids.append(1)
        batch = prepare(StepPlan([ScheduledChunk(1, 0, 20, sample=False)]))  # mid-prompt, alone in its step
        assert batch.logits_idx.numel() == 0
        assert model(batch.input_ids, batch.positions, batch.meta, runner.cache, batch.logits_idx).shape == (0, VOCAB)
        got, want = selected_and_every(StepPlan([ScheduledChunk(1, 20, 17, sample=True),
                                                 ScheduledChunk(2, 3, 1, sample=True)]))
        assert got.shape == want.shape == (2, VOCAB)
        close(got, want)
        close(got[0], whole)
    finally:
        stack.forget(seqs)
