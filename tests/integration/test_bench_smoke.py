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
            "bandwidth_bound_tok_s", "gemm_bound_tok_s", "bandwidth_gb_s", "gemm_gflop_s", "batched_tok_s"]
    for key in keys:
        assert out[key] > 0, key
    assert len(out["configs"]) == 4
    for row in out["configs"]:
        for side in ("ours", "transformers"):
            assert row[side]["tok_s"] > 0 and row[side]["ttft_p99_ms"] >= row[side]["ttft_p50_ms"] > 0


def test_bad_concurrency_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "engine", "--concurrency", "0,x"]) == 2
    assert "--concurrency" in capsys.readouterr().err
