"""`homeai bench engine --quick --json` runs end to end and reports every figure (never asserts speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homeai.cli.main import main

pytestmark = pytest.mark.slow


def test_quick_engine_bench_prints_all_figures(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(homeai_cache_dir))  # the copy pulled_models made
    monkeypatch.setenv("HOMEAI_CPU_THREADS", "2")
    code = main(["bench", "engine", "--quick", "--concurrency", "1,2", "--max-tokens", "4", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    keys = ["ratio_uniform_c1", "ratio_uniform_c2", "ratio_mixed_c1", "ratio_mixed_c2", "single_stream_tok_s",
            "bandwidth_bound_tok_s", "gemm_bound_tok_s", "bandwidth_gb_s", "gemm_gflop_s", "batched_tok_s",
            "single_stream_bw_ratio", "single_stream_bw_ratio_int8", "int8_over_fp32_single", "idle_ttft_ms",
            "idle_ttft_ms_none"]
    for key in keys:
        assert out[key] > 0, key
    assert len(out["configs"]) == 4
    assert out["speed"]["formats"]["int8"]["weight_mb"] < 0.3 * out["speed"]["formats"]["none"]["weight_mb"]
    for row in out["configs"]:
        for side in ("ours", "transformers"):
            assert row[side]["tok_s"] > 0 and row[side]["ttft_p99_ms"] >= row[side]["ttft_p50_ms"] > 0


def test_bad_concurrency_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--concurrency", "0,x"]) == 2
    assert "--concurrency" in capsys.readouterr().err


def test_speed_bench_on_random_weights(capsys: pytest.CaptureFixture[str]) -> None:
    """`homeai bench speed --shape` needs no model files (how a GPU is measured); one tiny run."""
    code = main(["bench", "speed", "--shape", "smollm2-135m", "--device", "cpu", "--batch", "1,2", "--steps", "2",
                 "--transformers", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["formats"]) == {"none", "int8"} and out["dtype"] == "float32"
    for row in out["formats"].values():
        assert row["decode_tok_s_b1"] > 0 and row["decode_tok_s_b2"] > 0 and row["idle_ttft_ms"] > 0
    assert out["int8_over_fp32_single"] > 0 and out["single_stream_bw_ratio"] > 0
    assert out["transformers"]["decode_tok_s_b2"] > 0 and out["ours_over_transformers_b1"] > 0
