"""The constrained-decoding figure of `homeai bench engine` runs end to end (never asserts speed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from homeai.bench.constrained_bench import STREAMS, constrained_overhead
from homeai.bench.engine_bench import BenchConfig, make_prompts
from homeai.engine.builder import EngineConfig, build_llm_engine
from homeai.engine.device_loop import run_alone

pytestmark = pytest.mark.slow


def test_constrained_overhead_reports_both_rates(pulled_models: dict[str, Path]) -> None:
    engine = build_llm_engine(pulled_models["smollm2-135m-instruct"],
                              EngineConfig(device="cpu", dtype="float32", kv_cache_mb=64, max_num_seqs=STREAMS))
    loop = run_alone(engine)
    try:
        out = constrained_overhead(engine, make_prompts(engine.tokenizer, STREAMS, BenchConfig()), 16, rounds=1,
                                   log=lambda _line: None)
    finally:
        loop.shutdown()
    detail = out["constrained"]
    assert out["constrained_overhead_c16"] > 0
    assert detail["unconstrained_decode_tok_s"][0] > 0 and detail["constrained_decode_tok_s"][0] > 0
