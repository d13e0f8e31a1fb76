"""Our engine against transformers' static-batch ``generate``: same model, prompts, machine and run.

    homeai bench engine [--json] [--concurrency 1,8,32] [--quick]

For each workload (uniform: 128 output tokens; mixed: 16..512, long-tailed) and concurrency c, both
serve ``waves * c`` requests with at most c in flight: ours through the async engine (a request starts
as soon as a slot frees), transformers in static batches of c that run until their longest member is
done (the waste continuous batching removes). EOS is ignored so every request makes its full length.
Reported: aggregate generated tokens/s, TTFT p50/p99 (for transformers, when its batch's first token
appears), the ratio ours/transformers, and how close a step gets to the machine's measured limits:
single-stream decode against the memory-bandwidth bound, batched decode against the fp32 GEMM bound.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

WORDS = ("the house light kitchen music evening garden window quiet river morning story small bright "
         "remember tomorrow water coffee train city friend letter winter summer recipe bread green "
         "question answer machine careful simple because under between always never people warm").split()


@dataclass(slots=True)
class BenchConfig:
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32])
    uniform_tokens: int = 128
    mixed_min_tokens: int = 16
    mixed_max_tokens: int = 512
    waves: int = 2  # requests per config = waves * c, so continuous batching can refill freed slots
    prompt_tokens: tuple[int, int] = (32, 64)
    seed: int = 0
    probe_mb: int = 1024  # size of the tensor summed to measure read bandwidth
    workloads: tuple[str, ...] = ("uniform", "mixed")
    compile_decode: bool = True  # ours with its compiled decode path (compiled before timing starts)
    constrained_tokens: int = 64  # the constrained-decoding overhead: 16 streams of these, with and without a
    constrained_rounds: int = 2  # schema, this many times

    @classmethod
    def quick(cls, concurrency: list[int], max_tokens: int = 16) -> BenchConfig:
        return cls(concurrency, uniform_tokens=max_tokens, mixed_min_tokens=max(1, max_tokens // 8),
                   mixed_max_tokens=max_tokens * 2, waves=1, prompt_tokens=(8, 16), probe_mb=128,
                   compile_decode=False, constrained_tokens=16, constrained_rounds=1)


@dataclass(slots=True)
class RunResult:
    num_tokens: int
    wall_s: float
    ttfts_s: list[float]
    decode_tok_s: list[float] = field(default_factory=list)  # per request, first to last token

    def summary(self) -> dict[str, float]:
        ttfts = sorted(self.ttfts_s)
        return {"tok_s": self.num_tokens / self.wall_s, "wall_s": self.wall_s,
                "ttft_p50_ms": 1e3 * percentile(ttfts, 50), "ttft_p99_ms": 1e3 * percentile(ttfts, 99)}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def output_lengths(kind: str, n: int, cfg: BenchConfig) -> list[int]:
    """Uniform, or long-tailed (log-normal, most short, a few near the maximum), from a fixed seed."""
    if kind == "uniform":
        return [cfg.uniform_tokens] * n
    rng = random.Random(cfg.seed + n)
    lo, hi = cfg.mixed_min_tokens, cfg.mixed_max_tokens
    lengths = [min(hi, max(lo, int(lo * 2.5 * rng.lognormvariate(0.0, 1.1)))) for _ in range(n)]
    lengths[rng.randrange(n)] = hi  # every run has its long tail, even a small one
    return lengths


def make_prompts(tokenizer: Any, n: int, cfg: BenchConfig) -> list[list[int]]:
    rng = random.Random(cfg.seed)
    prompts = []
    for _ in range(n):
        ids = tokenizer(" ".join(rng.choice(WORDS) for _ in range(96))).input_ids
        prompts.append(ids[:rng.randint(*cfg.prompt_tokens)])
    return prompts


# ---- the machine's limits ----------------------------------------------------------------------------

def best_s(fn: Any, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_machine(probe_mb: int) -> dict[str, float]:
    """Read bandwidth (summing a large fp32 tensor) and fp32 GEMM rate (2048x2048 matmul)."""
    probe = torch.ones(probe_mb * 2**20 // 4)
    bandwidth = probe.numel() * 4 / best_s(probe.sum)
    probe = torch.empty(0)  # give the memory back before the models load
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    gemm = 2 * 2048**3 / best_s(lambda: a @ b)
    return {"bandwidth_gb_s": bandwidth / 1e9, "gemm_gflop_s": gemm / 1e9}


def weight_stats(model: Any) -> tuple[int, int]:
    """(bytes read per decode step, parameter count) of our model's distinct weights, in their format."""
    return model.weight_bytes(), model.num_params()


# ---- the two contenders ------------------------------------------------------------------------------

async def run_ours(engine: Any, prompts: list[list[int]], lengths: list[int], c: int) -> RunResult:
    from homeai.core.types import SamplingParams

    slots = asyncio.Semaphore(c)
    ttfts: list[float] = []
    rates: list[float] = []

    async def one(ids: list[int], n: int) -> int:
        async with slots:
            start = time.perf_counter()
            first = last = 0.0
            got = 0
            async for delta in engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=n,
                                                                   ignore_eos=True)):
                if delta.token_ids and not got:
                    first = time.perf_counter()
                    ttfts.append(first - start)
                got, last = delta.num_output_tokens, time.perf_counter()
            if got > 1 and last > first:
                rates.append((got - 1) / (last - first))
            return got

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(p, n) for p, n in zip(prompts, lengths, strict=True)))
    return RunResult(sum(counts), time.perf_counter() - start, ttfts, rates)


def run_transformers(model: Any, pad_id: int, prompts: list[list[int]], lengths: list[int], c: int) -> RunResult:
    from transformers import LogitsProcessorList

    ttfts: list[float] = []
    wall = 0.0
    for i in range(0, len(prompts), c):
        batch, want = prompts[i:i + c], lengths[i:i + c]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        marker = _FirstStep()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(want),
                           min_new_tokens=max(want), do_sample=False, pad_token_id=pad_id,
                           logits_processor=LogitsProcessorList([marker]))
        wall += time.perf_counter() - start
        ttfts += [(marker.first_s or start) - start] * len(batch)
    return RunResult(sum(lengths), wall, ttfts)


class _FirstStep:
    """A logits processor that only notes when the first step's logits exist (the batch's TTFT)."""

    def __init__(self) -> None:
        self.first_s: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.first_s is None:
            self.first_s = time.perf_counter()
        return scores


# ---- the run -----------------------------------------------------------------------------------------

def run_bench(folder: Path, cfg: BenchConfig, threads: int | None = None, log: Any = print) -> dict[str, Any]:
    """Measure everything in one process; returns one flat-ish JSON-ready dict."""
    from transformers import LlamaForCausalLM

    from homeai.bench.constrained_bench import constrained_overhead
    from homeai.engine.builder import EngineConfig, build_llm_engine
    from homeai.engine.device_loop import run_alone
    from homeai.repository.cache import default_cache_dir
    from homeai.runtime.device import in_passing_thread
    from homeai.runtime.llama_config import LlamaConfig

    threads = threads or int(os.environ.get("HOMEAI_CPU_THREADS", "0")) or os.cpu_count() or 1
    os.environ["HOMEAI_CPU_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    machine = in_passing_thread(measure_machine, cfg.probe_mb)
    log(f"machine: {machine['bandwidth_gb_s']:.1f} GB/s read, {machine['gemm_gflop_s']:.1f} GFLOP/s fp32 GEMM, "
        f"{threads} threads")
    mc = LlamaConfig.from_folder(folder)
    max_c = max(*cfg.concurrency, 16)  # 16: the constrained-decoding streams (constrained_bench)
    kv_tokens = max_c * (cfg.prompt_tokens[1] + max(cfg.uniform_tokens, cfg.mixed_max_tokens) + 32)
    kv_mb = math.ceil(kv_tokens * 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 4 / 2**20)
    engine = build_llm_engine(folder, EngineConfig(device="cpu", dtype="float32", quantization="none",
                                                   kv_cache_mb=kv_mb,
                                                   max_num_seqs=max_c, max_model_len=2048,
                                                   compile_decode="on" if cfg.compile_decode else "off",
                                                   cache_dir=default_cache_dir()))
    if engine.runner.compiled is not None:  # compiled before anything is timed
        compile_start = time.perf_counter()
        engine.runner.compiled.wait()
        log(f"compiled decode buckets {engine.runner.compiled.ready_buckets} in "
            f"{time.perf_counter() - compile_start:.0f}s (failed: {engine.runner.compiled.failed})")
    # transformers loads and runs in passing threads, and ours stops while it runs: each contender's
    # OpenMP pool is then the only one, as it is in a server (see runtime.device.in_passing_thread).
    hf = in_passing_thread(lambda: LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())
    pad_id = engine.tokenizer.pad_token_id or 0
    weight_bytes, num_params = weight_stats(engine.runner.model)
    loop = run_alone(engine)
    out: dict[str, Any] = {"threads": threads, "device": "cpu", "dtype": "float32", **machine,
                           "compiled_decode": engine.runner.compiled is not None,
                           "weight_mb": weight_bytes / 1e6, "num_params": num_params, "configs": []}
    try:
        warm = make_prompts(engine.tokenizer, 2, cfg)
        asyncio.run(run_ours(engine, warm, [4, 4], 2))
        loop.shutdown()
        in_passing_thread(run_transformers, hf, pad_id, warm, [4, 4], 2)
        for kind in cfg.workloads:
            for c in cfg.concurrency:
                n = cfg.waves * c if c > 1 else max(2, cfg.waves)
                prompts, lengths = make_prompts(engine.tokenizer, n, cfg), output_lengths(kind, n, cfg)
                loop = run_alone(engine)
                ours = asyncio.run(run_ours(engine, prompts, lengths, c))
                loop.shutdown()
                theirs = in_passing_thread(run_transformers, hf, pad_id, prompts, lengths, c)
                row: dict[str, Any] = {
                    "workload": kind, "concurrency": c, "num_requests": n, "output_tokens": sum(lengths),
                    "max_output_tokens": max(lengths), "ours": ours.summary(), "transformers": theirs.summary()}
                row["ratio"] = row["ours"]["tok_s"] / row["transformers"]["tok_s"]
                out[f"ratio_{kind}_c{c}"] = row["ratio"]
                out["configs"].append(row)
                if kind == "uniform" and c == min(cfg.concurrency):
                    out["single_stream_tok_s"] = statistics.median(ours.decode_tok_s or [0.0])
                log(_line(row))
        prompts = make_prompts(engine.tokenizer, 16, cfg)
        loop = run_alone(engine)
        out.update(constrained_overhead(engine, prompts, max(cfg.uniform_tokens, cfg.constrained_tokens),
                                        cfg.constrained_rounds, log=log))
    finally:
        loop.shutdown()
    out.update(speed_figures(folder, cfg, log))
    out["bandwidth_bound_tok_s"] = machine["bandwidth_gb_s"] * 1e9 / weight_bytes
    out["gemm_bound_tok_s"] = machine["gemm_gflop_s"] * 1e9 / (2 * num_params)
    best = max((r["ours"]["tok_s"] for r in out["configs"] if r["workload"] == "uniform"), default=0.0)
    out["batched_tok_s"] = best
    out["single_stream_of_bandwidth_bound"] = out.get("single_stream_tok_s", 0.0) / out["bandwidth_bound_tok_s"]
    out["batched_of_gemm_bound"] = best / out["gemm_bound_tok_s"]
    return out


def speed_figures(folder: Path, cfg: BenchConfig, log: Any) -> dict[str, Any]:
    """float32, int8 and int4 weights side by side (homeai.bench.speed_bench): single_stream_bw_ratio,
    int8_over_fp32_single, int4_over_fp32_single, idle_ttft_ms (int8, 46-token prompt); the per-format
    rows under "speed"."""
    from homeai.bench.speed_bench import headline, run_speed

    steps = 8 if cfg.probe_mb < 1024 else 32  # --quick: a smoke run
    formats = ["none", "int8", "int4"]
    formats += [f + "+compiled" for f in formats] if cfg.compile_decode else []
    speed = run_speed(folder, torch.device("cpu"), torch.float32, formats, [1, 16], steps, log)
    return {**headline(speed), "speed": speed}


def _line(row: dict[str, Any]) -> str:
    o, t = row["ours"], row["transformers"]
    return (f"{row['workload']:>7} c={row['concurrency']:<3} n={row['num_requests']:<3} "
            f"ours {o['tok_s']:7.1f} tok/s ttft p50/p99 {o['ttft_p50_ms']:7.0f}/{o['ttft_p99_ms']:7.0f} ms | "
            f"transformers {t['tok_s']:7.1f} tok/s ttft p50/p99 {t['ttft_p50_ms']:7.0f}/{t['ttft_p99_ms']:7.0f} ms"
            f" | ratio {row['ratio']:.2f}")


def format_bounds(out: dict[str, Any]) -> str:
    return (f"single-stream decode {out['single_stream_tok_s']:.1f} tok/s = "
            f"{100 * out['single_stream_of_bandwidth_bound']:.0f}% of the bandwidth bound "
            f"{out['bandwidth_bound_tok_s']:.1f} tok/s ({out['weight_mb']:.0f} MB of weights per step)\n"
            f"batched {out['batched_tok_s']:.1f} tok/s = {100 * out['batched_of_gemm_bound']:.0f}% of the "
            f"GEMM bound {out['gemm_bound_tok_s']:.1f} tok/s (2 x {out['num_params'] / 1e6:.0f}M FLOPs per token)")
