"""The compiled decode path (homeai.runtime.decode_graph) against the eager one, on the real SmolLM2-135M
weights, its first layers (every layer compiles to the same code; tests/unit/runtime/test_step_shapes.py
drives every weight format through the compiled path on a small model).

Each test compiles one batch bucket (half a minute on two cores, most of it Inductor's first start; its
disk cache makes reruns faster): (a) logits of every decode step match eager within the tolerance the
eager path meets against transformers, with rows padded up to the bucket and contexts spanning several
blocks, and the padding writes only the scratch block; (b) the CUDA-graph layout (context padded to the
model's maximum) gives the same logits; (c) through the ModelRunner, greedy outputs are identical with
and without the compiled path, and the steps were in fact served compiled.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import assert_engine_empty
from torch._dynamo.utils import counters

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams
from homeai.engine.builder import load_tokenizer
from homeai.engine.model_runner import ModelRunner
from homeai.runtime import decode_graph
from homeai.runtime.decode_graph import CompiledDecode, should_compile
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.scheduling.fcfs import FCFSScheduler

pytestmark = pytest.mark.slow
LOGITS_ATOL = 1e-3  # as tests/integration/test_llm_correctness.py holds eager against transformers
TEXTS = ["The quick brown fox", "Water boils at",
         "In a small village by the sea, there lived an old fisherman who every morning walked down to the "
         "harbour, untied his little blue boat and rowed out past the lighthouse to where the mackerel ran"]


COMPILED_LAYERS = 4  # of SmolLM2's 30: each layer compiles to the same code, and 30 take ~45 s on two cores


@pytest.fixture(scope="module")
def model(pulled_models: dict[str, Path]) -> LlamaModel:
    """The real SmolLM2 weights and tokenizer, its first COMPILED_LAYERS layers (compiled and eager alike)."""
    torch.set_num_threads(2)
    model = LlamaModel.from_folder(pulled_models["smollm2-135m-instruct"], torch.device("cpu"), torch.float32)
    model.layers = model.layers[:COMPILED_LAYERS]
    model.cfg.num_layers = COMPILED_LAYERS
    return model


@pytest.fixture(scope="module")
def prompts(pulled_models: dict[str, Path]) -> list[list[int]]:
    tokenizer = load_tokenizer(pulled_models["smollm2-135m-instruct"])
    return [tokenizer(t).input_ids for t in TEXTS]


def make_stack(model: LlamaModel) -> tuple[FCFSScheduler, ModelRunner]:
    cfg = model.cfg
    bm = BlockManager(64, 16)
    cache = KVCache(cfg.num_layers, 64, 16, cfg.num_kv_heads, cfg.head_dim, model.device, model.kv_dtype)
    return FCFSScheduler(bm, 512, 8), ModelRunner(model, cache)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def start(sched: FCFSScheduler, runner: ModelRunner, prompts: list[list[int]], max_tokens: int) -> list[Sequence]:
    """Add the prompts and run steps until every sequence decodes (prefill is always eager)."""
    seqs = [Sequence(i, f"r{i}", p, greedy(max_tokens)) for i, p in enumerate(prompts)]
    for seq in seqs:
        sched.add(seq)
    while any(not s.output_token_ids for s in seqs):
        plan = sched.schedule()
        sched.update(plan, runner.execute(plan, sched.seqs))
    return seqs


@pytest.mark.parametrize("static_context", [False, True], ids=["dynamic-context", "cuda-graph-layout"])
def test_compiled_logits_match_eager(model: LlamaModel, prompts: list[list[int]], static_context: bool) -> None:
    sched, runner = make_stack(model)
    compiled = CompiledDecode(model, runner.cache, max_model_len=256, max_batch=4, buckets=(4,),
                              static_context=static_context)
    assert compiled.compile_bucket(4), compiled.failed
    start(sched, runner, prompts, 8)  # three rows: the bucket of four pads one
    kv = runner.cache.kv
    scratch = slice(runner.cache.scratch_slot, runner.cache.scratch_slot + runner.cache.block_size)
    for _ in range(6):
        plan = sched.schedule()
        batch = runner.prepare(plan, sched.seqs)
        meta = batch.meta
        assert meta.all_decode and meta.decode_slots is not None and meta.decode_lens is not None
        before = kv.clone()
        with torch.inference_mode():
            eager = model(batch.input_ids, batch.positions, meta, runner.cache, batch.logits_idx)
            after_eager = kv.clone()
            kv.copy_(before)
            out = compiled.run(4, batch.input_ids, batch.positions, meta.slot_mapping, meta.decode_slots,
                               meta.decode_lens)
        fast = out.logits[batch.logits_idx]
        assert fast.shape == eager.shape
        assert (fast - eager).abs().max().item() <= LOGITS_ATOL
        assert torch.equal(fast.argmax(-1), eager.argmax(-1))
        # The greedy picks fused into the step: the eager logits' argmax and log-softmax there.
        assert torch.equal(out.greedy.tokens, eager.argmax(-1))
        expected = eager.log_softmax(-1).gather(1, eager.argmax(-1, keepdim=True)).squeeze(1)
        assert torch.allclose(out.greedy.logprobs, expected, atol=LOGITS_ATOL)
        # The step's own slots hold the same keys and values; padding touched nothing but the scratch block.
        written = meta.slot_mapping
        # float32 rounding only: keys and values reach ~15 and differ by ~2e-5 after 30 layers of
        # differently fused arithmetic (padding or a wrong slot would differ by their own size).
        assert torch.allclose(kv[:, written], after_eager[:, written], atol=1e-4)
        untouched = torch.ones(kv.shape[1], dtype=torch.bool)
        untouched[written] = False
        untouched[scratch] = False
        assert torch.equal(kv[:, untouched], before[:, untouched])
        sched.update(plan, runner.execute(plan, sched.seqs))  # eager step: the runner has no compiled path


def test_runner_greedy_outputs_identical_compiled_and_eager(model: LlamaModel, prompts: list[list[int]]) -> None:
    outputs = []
    for use_compiled in (False, True):
        sched, runner = make_stack(model)
        if use_compiled:
            runner.compiled = CompiledDecode(model, runner.cache, max_model_len=256, max_batch=4, buckets=(4,))
            assert runner.compiled.compile_bucket(4), runner.compiled.failed
        graphs = counters["stats"]["unique_graphs"]
        seqs = start(sched, runner, prompts, 20)
        while sched.has_work():  # context lengths grow across block boundaries; rows leave at the end
            plan = sched.schedule()
            sched.update(plan, runner.execute(plan, sched.seqs))
        assert counters["stats"]["unique_graphs"] == graphs  # live steps never compile (a stall)
        assert_engine_empty(sched)
        outputs.append([s.output_token_ids for s in seqs])
        if use_compiled:
            assert runner.compiled_steps >= 18  # every decode step after the prefills ran compiled
    assert outputs[0] == outputs[1]


def test_bucket_choice_and_auto_rule(model: LlamaModel, monkeypatch: pytest.MonkeyPatch) -> None:
    _, runner = make_stack(model)
    compiled = CompiledDecode(model, runner.cache, max_model_len=256, max_batch=40, buckets=decode_graph.BUCKETS)
    assert compiled.buckets == (1, 2, 4, 8, 16, 32, 64)  # 64 covers a batch of 40
    on_cpu = CompiledDecode(model, runner.cache, max_model_len=256, max_batch=64)
    assert on_cpu.buckets == decode_graph.CPU_BUCKETS  # above 16 rows a CPU step stays eager
    assert compiled.bucket_for(3) is None  # nothing compiled yet: eager
    compiled._ready.add(4)
    assert compiled.bucket_for(3) == 4 and compiled.bucket_for(5) is None
    assert should_compile("on", torch.device("cpu")) and not should_compile("off", torch.device("cuda"))
    assert should_compile("auto", torch.device("cpu"))  # on by default wherever it can build (a C++ compiler)
    with monkeypatch.context() as m:  # ...and where it cannot, steps stay eager instead of failing
        m.setattr(decode_graph.shutil, "which", lambda _name: None)
        assert not should_compile("auto", torch.device("cpu"))
    with pytest.raises(ValueError, match="compile_decode"):
        should_compile("yes", torch.device("cpu"))
