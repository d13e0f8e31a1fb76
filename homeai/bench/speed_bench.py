"""Step-level speed of our decoder per weight format, side by side in one process.

    homeai bench speed [--shape smollm2-135m|llama-3.2-1b] [--device cuda] [--dtype bf16] [--json]

Each figure times whole engine steps (schedule, build the batch, forward, sample) with the formats
interleaved step by step, so a neighbour's load hits every format alike and the ratios hold on a noisy
shared machine. Reported per format: decode tokens/s at each batch size, the memory-bandwidth bound
(measured read bandwidth / weight bytes the format reads per step) and the share of it reached, and
the idle time to first token of a 46-token prompt (one prefill step, sampling included).

``--shape`` runs a random-initialised model of a known shape instead of a pulled one: weights do not
change speed, so the GPU path can be measured where model files cannot travel.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from homeai.bench.shapes import SHAPES
from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams
from homeai.engine.model_runner import ModelRunner
from homeai.runtime.decode_graph import BUCKETS, CompiledDecode
from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import LlamaModel
from homeai.runtime.llama_config import LlamaConfig
from homeai.scheduling.fcfs import FCFSScheduler

TTFT_PROMPT_TOKENS = 46  # the idle-TTFT prompt, as long as the one homeai bench serve's idle phase sends


class RandomWeights(Mapping[str, torch.Tensor]):
    """The tensors of a Llama checkpoint of shape ``cfg``, made on access (one at a time, seeded by name)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        c = cfg
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self._shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
                                                    "model.norm.weight": (c.hidden_size,)}
        per_layer = {"input_layernorm.weight": (c.hidden_size,), "post_attention_layernorm.weight": (c.hidden_size,),
                     "self_attn.q_proj.weight": (q, c.hidden_size), "self_attn.k_proj.weight": (kv, c.hidden_size),
                     "self_attn.v_proj.weight": (kv, c.hidden_size), "self_attn.o_proj.weight": (c.hidden_size, q),
                     "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
                     "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
                     "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size)}
        for i in range(c.num_layers):
            self._shapes.update({f"model.layers.{i}.{k}": v for k, v in per_layer.items()})

    def __getitem__(self, name: str) -> torch.Tensor:
        shape = self._shapes[name]
        if len(shape) == 1:
            return torch.ones(shape)
        gen = torch.Generator().manual_seed(sum(name.encode()) * 7919 + len(name))
        return torch.randn(shape, generator=gen) * 0.02

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


COMPILED = "+compiled"  # a format name with this suffix: the same weights, decode steps compiled


def load_models(source: Path | str, device: torch.device, dtype: torch.dtype,
                formats: list[str]) -> dict[str, LlamaModel]:
    """One model per format, from a pulled folder or a shape name (random weights); a "+compiled"
    variant shares the weights of its eager format."""
    models: dict[str, LlamaModel] = {}
    for f in formats:
        weights = f.removesuffix(COMPILED)
        if weights not in models:
            if isinstance(source, str):
                cfg = LlamaConfig(**SHAPES[source])
                models[weights] = LlamaModel(cfg, RandomWeights(cfg), device, dtype, weights)
            else:
                models[weights] = LlamaModel.from_folder(source, device, dtype, weights)
    return {f: models[f.removesuffix(COMPILED)] for f in formats}


class _Stack:
    """A scheduler and runner over a private KV pool: the engine's step without its thread."""

    def __init__(self, model: LlamaModel, num_seqs: int, max_len: int, compiled: bool = False) -> None:
        cfg, block_size = model.cfg, 16
        num_blocks = num_seqs * -(-max_len // block_size) + 1
        bm = BlockManager(num_blocks, block_size)
        cache = KVCache(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, model.device,
                        model.kv_dtype)
        self.sched, self.runner = FCFSScheduler(bm, 4096, num_seqs), ModelRunner(model, cache)
        if compiled:  # only the bucket this stack decodes in, compiled now (not timed)
            bucket = next(b for b in BUCKETS if b >= num_seqs)
            self.runner.compiled = CompiledDecode(model, cache, max_len, num_seqs, buckets=(bucket,))
            if not self.runner.compiled.compile_bucket(bucket):
                raise RuntimeError(f"compiling the decode step failed: {self.runner.compiled.failed}")
        self.vocab = cfg.vocab_size
        self.next_id = 0

    def add(self, prompt_len: int, max_tokens: int) -> None:
        prompt = [(self.next_id * 131 + 7 * j) % (self.vocab - 1) + 1 for j in range(prompt_len)]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.sched.add(Sequence(self.next_id, f"s{self.next_id}", prompt, params))
        self.next_id += 1

    def step(self) -> tuple[int, float]:
        """One engine step: (number of sequences sampled, seconds)."""
        start = time.perf_counter()
        plan = self.sched.schedule()
        out = self.runner.execute(plan, self.sched.seqs)
        self.sched.update(plan, out)
        return len(out.sampled), time.perf_counter() - start


def decode_rates(models: dict[str, LlamaModel], batch: int, steps: int, prompt_len: int = 32) -> dict[str, float]:
    """Decode tokens/s of ``batch`` sequences per model, steps interleaved across models."""
    stacks = {f: _Stack(m, batch, prompt_len + steps + 8, f.endswith(COMPILED)) for f, m in models.items()}
    for stack in stacks.values():
        for _ in range(batch):
            stack.add(prompt_len, steps + 4)
        while len(stack.sched.seqs) and stack.step()[0] < batch:  # prefill until every sequence decodes
            pass
        stack.step()  # one decode step to warm up
    times: dict[str, list[float]] = {f: [] for f in models}
    for _ in range(steps):
        for f, stack in stacks.items():
            times[f].append(stack.step()[1])
    return {f: batch / statistics.median(t) for f, t in times.items()}


def idle_ttft_ms(models: dict[str, LlamaModel], repeats: int = 7) -> dict[str, float]:
    """p50 of one prefill step (46 tokens, then the first token sampled) on an idle model."""
    stacks = {f: _Stack(m, 1, TTFT_PROMPT_TOKENS + 2) for f, m in models.items()}
    times: dict[str, list[float]] = {f: [] for f in models}
    for i in range(repeats + 1):
        for f, stack in stacks.items():
            stack.add(TTFT_PROMPT_TOKENS, 1)
            _, elapsed = stack.step()
            if i:  # the first one warms up
                times[f].append(elapsed)
    return {f: 1e3 * statistics.median(t) for f, t in times.items()}


def transformers_rates(source: Path | str, device: torch.device, dtype: torch.dtype, batches: list[int],
                       steps: int, prompt_len: int = 32) -> dict[int, float]:
    """transformers' ``generate`` on the same weights: decode tokens/s per static batch (prefill excluded by
    timing ``steps + 1`` new tokens against 1 and taking the difference)."""
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    if isinstance(source, str):
        c = LlamaConfig(**SHAPES[source])
        hf_cfg = HFConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                          num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
                          max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=True)
        # transformers wraps PreTrainedModel.to with functools.wraps, which mypy calls as if unbound
        model = LlamaForCausalLM(hf_cfg).to(dtype)  # type: ignore[arg-type]
        model.load_state_dict(dict(RandomWeights(c).items()), strict=False)
    else:
        model = LlamaForCausalLM.from_pretrained(source, dtype=dtype)
    model = model.to(device).eval()
    rates = {}
    for batch in batches:
        ids = torch.randint(1, model.config.vocab_size - 1, (batch, prompt_len), device=device,
                            generator=torch.Generator(device=device).manual_seed(batch))

        def gen(new: int, ids: torch.Tensor = ids) -> float:
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                               min_new_tokens=new, do_sample=False, pad_token_id=0)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        gen(2)  # warm-up
        rates[batch] = batch * steps / max(1e-9, gen(steps + 1) - gen(1))
    return rates


def read_bandwidth_gb_s(device: torch.device, probe_mb: int = 512) -> float:
    """Read bandwidth: the best of three sums of a large tensor (what a memory-bound step is up to)."""
    probe = torch.ones(probe_mb * 2**20 // 4, device=device)
    best = float("inf")
    for _ in range(4):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        probe.sum().item()
        best = min(best, time.perf_counter() - start)
    return probe.numel() * 4 / best / 1e9


def run_speed(source: Path | str, device: torch.device, dtype: torch.dtype, formats: list[str],
              batches: list[int], steps: int = 24, log: Any = print, with_transformers: bool = False) -> dict[str, Any]:
    """Every figure for ``formats`` (the first is the baseline), as one JSON-ready dict; with
    ``with_transformers`` also transformers' decode rate on the same weights and device."""
    bandwidth = read_bandwidth_gb_s(device)
    models = load_models(source, device, dtype, formats)
    out: dict[str, Any] = {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
                           "source": str(source), "bandwidth_gb_s": bandwidth, "formats": {}}
    ttft = idle_ttft_ms(models)
    rates = {b: decode_rates(models, b, steps) for b in batches}
    for f, model in models.items():
        bound = bandwidth * 1e9 / model.weight_bytes()
        row = {"weight_mb": model.weight_bytes() / 1e6, "bandwidth_bound_tok_s": bound,
               "idle_ttft_ms": ttft[f], **{f"decode_tok_s_b{b}": rates[b][f] for b in batches}}
        row["single_stream_bw_ratio"] = rates[min(batches)][f] / bound
        out["formats"][f] = row
        log(f"{f:>5}: {row['weight_mb']:.0f} MB, " + ", ".join(f"b{b} {rates[b][f]:.1f} tok/s" for b in batches)
            + f", {100 * row['single_stream_bw_ratio']:.0f}% of the {bound:.1f} tok/s bandwidth bound,"
            f" idle TTFT {ttft[f]:.0f} ms ({TTFT_PROMPT_TOKENS} tokens)")
    if with_transformers:
        del models
        theirs = transformers_rates(source, device, dtype, batches, steps)
        out["transformers"] = {f"decode_tok_s_b{b}": r for b, r in theirs.items()}
        base = out["formats"][formats[0]]
        for b in batches:
            out[f"ours_over_transformers_b{b}"] = base[f"decode_tok_s_b{b}"] / theirs[b]
        log("transformers: " + ", ".join(f"b{b} {r:.1f} tok/s" for b, r in theirs.items()))
    return out


def headline(speed: dict[str, Any]) -> dict[str, float]:
    """The summary keys: the baseline's bandwidth share, and int8 against it when both ran. When compiled
    variants ran, the headline keys are theirs (the fast path) and the eager figures get an ``_eager``
    suffix."""
    formats = speed["formats"]
    base = next(iter(formats))
    single = min(int(k.removeprefix("decode_tok_s_b")) for k in formats[base] if k.startswith("decode_tok_s_b"))
    rate = f"decode_tok_s_b{single}"
    out: dict[str, float] = {"idle_ttft_ms": formats[base]["idle_ttft_ms"]}
    compiled = base + COMPILED in formats
    for suffix, key in [("", "_eager" if compiled else "")] + ([(COMPILED, "")] if compiled else []):
        out["single_stream_bw_ratio" + key] = formats[base + suffix]["single_stream_bw_ratio"]
        for q in ("int8", "int4"):
            if base != q and q + suffix in formats:
                out[f"single_stream_bw_ratio_{q}{key}"] = formats[q + suffix]["single_stream_bw_ratio"]
                out[f"{q}_over_fp32_single{key}"] = formats[q + suffix][rate] / formats[base + suffix][rate]
    if "int8" in formats and base != "int8":
        out["idle_ttft_ms"] = formats["int8"]["idle_ttft_ms"]  # the headline idle TTFT is int8's when it ran
        out[f"idle_ttft_ms_{base}"] = formats[base]["idle_ttft_ms"]
    if "int4" in formats and base != "int4":
        out["idle_ttft_ms_int4"] = formats["int4"]["idle_ttft_ms"]
    return out
