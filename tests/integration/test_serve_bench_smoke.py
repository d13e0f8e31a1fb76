"""`homeai bench serve --quick --json` end to end: it starts `homeai serve` itself, runs every phase for a
few seconds and reports every figure with no error and nothing lost; `--url` measures a running server
the same way. Speed is never asserted: the figures are measured, not judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_launcher import running_server

from homeai.cli.main import main

pytestmark = pytest.mark.slow

HOUSEHOLD_KEYS = ("voice_ttft_p50_ms", "voice_ttft_p99_ms", "voice_ttft_p99_ratio", "voice_itl_p99_ms",
                  "voice_12th_token_p99_ms", "voice_12th_token_p99_ratio", "chat_ttft_p99_ms", "chat_itl_p99_ms",
                  "background_tok_s", "summaries_finished", "lost", "cut_at_window", "reference")


def run_bench(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["bench", "serve", "--json", "--quick", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_quick_serve_bench_reports_every_figure(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(homeai_cache_dir))  # the server it starts finds the test models
    out = run_bench(capsys, "--household-s", "5")

    assert out["errors"] == {"total": 0}, out["error_examples"]
    assert out["lost"] == 0
    for key in ("single_decode_tok_s", "idle_ttft_p50_ms", "idle_warm_ttft_p50_ms", "idle_repeat_ttft_p50_ms",
                "streams_1_tok_s", "streams_4_tok_s", "streams_8_tok_s", "streams_16_tok_s"):
        assert out[key] > 0, key
    household = out["household"]
    for key in HOUSEHOLD_KEYS:
        assert key in household, key
    assert household["lost"] == household["reference"]["lost"] == 0
    assert household["reference"]["voice_ttft_p50_ms"] > 0  # voice alone gets its first tokens in 5 s
    assert out["rss_mb"]["max"] >= out["rss_mb"]["at_ready"] > 0
    assert out["load_avg_1m"]["start"] is not None and out["load_avg_1m"]["end"] is not None
    assert out["prompt_tokens"]["46"] == 46  # prompts are sized exactly for SmolLM2's template
    assert out["model"] == "smollm2-135m-instruct" and "smollm2-135m-instruct" in out["server"]["models"]


def test_url_measures_a_running_server(pulled_models: dict[str, Path], homeai_cache_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with running_server(tmp_path / "data", homeai_cache_dir) as server:
        out = run_bench(capsys, "--url", server.url, "--phases", "idle,single", "--single-requests", "1",
                        "--idle-requests", "2")
    assert out["errors"] == {"total": 0} and out["lost"] == 0
    assert out["idle_ttft_p50_ms"] > 0 and out["idle_warm_ttft_p50_ms"] > 0 and out["single_decode_tok_s"] > 0
    assert out["idle_repeat_ttft_p50_ms"] > 0
    assert out["rss_mb"] is None and out["household"] is None and out["streams_16_tok_s"] is None
