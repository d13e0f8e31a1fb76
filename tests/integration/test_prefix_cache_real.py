"""Prefix caching on the real SmolLM2-135M (fp32, CPU): a chat turn whose system prompt was served
before reuses its blocks and computes the logits of a cold run (max abs diff <= 1e-3); and
`homeai bench prefix --quick --json` reports every figure (never asserts speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engine_helpers import assert_engine_empty

from homeai.bench.prefix_bench import prompt_ids, system_prompt
from homeai.cli.main import main
from homeai.core.types import SamplingParams
from homeai.engine.builder import EngineConfig, build_llm_engine
from homeai.engine.llm_engine import LLMEngine

pytestmark = pytest.mark.slow
LOGITS_ATOL = 1e-3


def logits_of(engine: LLMEngine, ids: list[int], max_tokens: int = 3) -> list[torch.Tensor]:
    """Greedy rows of one request, stepped alone on ``engine``."""
    rows: list[torch.Tensor] = []
    sampler = engine.runner.sampler
    sample = sampler.sample

    def recording(logits: torch.Tensor, *rest: object) -> object:
        rows.extend(r.clone() for r in logits)
        return sample(logits, *rest)

    sampler.sample = recording  # type: ignore[method-assign]
    try:
        seq = engine.make_sequence(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        engine.scheduler.add(seq)
        while engine.scheduler.has_work():
            engine.step()
    finally:
        sampler.sample = sample  # type: ignore[method-assign]
    return rows


def test_a_served_system_prompt_is_reused_with_the_logits_of_a_cold_run(pulled_models: dict[str, Path]) -> None:
    torch.set_num_threads(2)
    folder = pulled_models["smollm2-135m-instruct"]
    config = EngineConfig(device="cpu", dtype="float32", quantization="none", kv_cache_mb=64,
                          max_num_batched_tokens=128)
    warm = build_llm_engine(folder, config)
    system = system_prompt(warm.tokenizer, 300)
    logits_of(warm, prompt_ids(warm.tokenizer, system, "turn on the kitchen light"))
    ids = prompt_ids(warm.tokenizer, system, "what is the temperature in the office")
    warm_rows = logits_of(warm, ids)
    stats = warm.scheduler.block_manager.stats.snapshot()["default"]
    assert stats["num_hit_requests"] == 1 and stats["num_hit_tokens"] >= 256
    cold = build_llm_engine(folder, EngineConfig(device="cpu", dtype="float32", quantization="none",
                                                 kv_cache_mb=64, max_num_batched_tokens=128,
                                                 enable_prefix_caching=False))
    cold_rows = logits_of(cold, ids)
    diff = max(float((w - c).abs().max()) for w, c in zip(warm_rows, cold_rows, strict=True))
    assert len(warm_rows) == len(cold_rows) == 3 and diff <= LOGITS_ATOL, diff
    assert_engine_empty(warm)
    assert_engine_empty(cold)


def test_quick_prefix_bench_prints_all_figures(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(homeai_cache_dir))
    monkeypatch.setenv("HOMEAI_CPU_THREADS", "2")
    assert main(["bench", "prefix", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("cold_ttft_ms", "warm_ttft_ms", "warm_ttft_ratio", "voice_ttft_p50_ms_cached",
                "voice_ttft_p50_ms_uncached", "voice_ttft_p50_ratio", "hit_rate"):
        assert out[key] > 0, key
    # every turn after the first hits; the first may too, by the chat template's first tokens (reuse is by token)
    assert out["voice_turns"] == 4 and out["request_hit_rate"] >= 0.75
    assert out["system_prompt_tokens"] >= 200
