"""Latency margins on virtual time: the household as the real server sees it (household-real: 12 summaries of
1,500 tokens in flight, the server's 364-block KV pool, cpu-135m costs) and the latency margin's sweep
(`homeai bench sim --sweep-margin`): one row per setting with voice's TTFT p99 ratio, ITL p99, time to
its 12th token p99 and the background's tokens per second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homeai.bench.sim_bench import add_sim_arguments, run_sim
from homeai.policy.loader import load_policy
from homeai.sim.acceptance import SERVER_KV_BLOCKS, acceptance
from homeai.sim.cost_model import PROFILES
from homeai.sim.household import NTH_TOKEN
from homeai.sim.sweep import sweep, with_margin
from homeai.sim.trace import REAL_SUMMARIES_IN_FLIGHT, TRACE_SETTINGS, household_real

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def test_household_real_mirrors_the_serve_bench_mix() -> None:
    trace = household_real(20.0)
    voice = [r for r in trace if r.class_name == "voice"]
    chat = [r for r in trace if r.class_name == "chat"]
    summaries = [r for r in trace if r.class_name == "summarize"]
    assert [r.arrival_s for r in voice] == [0.5 + 2.0 * k for k in range(10)]
    assert all((r.prompt_tokens, r.max_tokens) == (40, 32) for r in voice)
    assert [r.arrival_s for r in chat] == [1.0, 6.0, 11.0, 16.0]
    assert all((r.prompt_tokens, r.max_tokens) == (100, 128) for r in chat)
    assert len(summaries) > REAL_SUMMARIES_IN_FLIGHT and all(
        (r.prompt_tokens, r.max_tokens, r.background) == (1500, 256, True) for r in summaries)
    assert not [r for r in household_real(20.0, background=False) if r.background]
    settings = TRACE_SETTINGS["household-real"]
    assert (settings.kv_blocks, settings.background_in_flight, settings.profile) == (
        SERVER_KV_BLOCKS, REAL_SUMMARIES_IN_FLIGHT, "cpu-135m")


def test_household_real_runs_at_the_servers_pool_and_loses_nothing() -> None:
    report = acceptance(load_policy(DEFAULT_POLICY), PROFILES["cpu-135m"], ("household-real",), horizon_s=20.0,
                        kv_blocks=(SERVER_KV_BLOCKS,))
    t = report["traces"]["household-real@kv364"]
    assert t["lost_requests"] == 0 and t["futile_preemptions"] == 0
    assert t["classes"]["summarize"]["tokens_per_s"] > 0
    assert t["voice_ttft_p99_ratio"] is not None and t["voice_nth_token_p99_s"] is not None


def test_the_sweep_reports_each_setting_and_the_margin_keeps_voice_near_the_quiet_house() -> None:
    """On household-real (20 s): without a margin a voice step carries the summaries' work and voice's
    ITL is what the budget allows; with the default margin voice's ITL and 12th token stay near the quiet
    house's, and the background still gets tokens."""
    report = sweep(load_policy(DEFAULT_POLICY), PROFILES["cpu-135m"], "household-real", [None, 0.15],
                   [0.05], horizon_s=20.0, kv_blocks=SERVER_KV_BLOCKS)
    rows = report["rows"]
    assert [(r["latency_margin"], r["arrival_step_fraction"]) for r in rows] == [(None, None), (0.15, 0.05)]
    nth = f"voice_token{NTH_TOKEN}_p99_ms"
    for r in rows:
        for key in ("voice_ttft_p99_ratio", "voice_itl_p99_ms", nth, "background_tok_s", "chat_ttft_p99_ms"):
            assert r[key] is not None, key
        assert r["lost_requests"] == 0 and r["futile_preemptions"] == 0
    unguarded, guarded = rows
    assert guarded["voice_itl_p99_ms"] <= 1.2 * guarded["voice_itl_p99_quiet_ms"]
    assert guarded["voice_itl_p99_ms"] < unguarded["voice_itl_p99_ms"]
    assert guarded[nth] < unguarded[nth]
    assert guarded["background_tok_s"] > 0
    json.loads(json.dumps(report))


def test_with_margin_sets_every_interactive_llm_class_and_none_unsets_them() -> None:
    policy = load_policy(DEFAULT_POLICY)
    p = with_margin(policy, 0.4, 0.2)
    assert p.classes["voice"].latency_margin == p.classes["chat"].latency_margin == 0.4
    assert p.classes["voice"].arrival_fraction == 0.2 and p.classes["voice"].margin_between_steps
    assert p.classes["summarize"].latency_margin is None
    bare = with_margin(policy, None)
    assert all(c.latency_margin is None and not c.margin_between_steps for c in bare.classes.values())


def test_the_cli_prints_the_sweep_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_sim_arguments(p)
    args = p.parse_args(["--trace", "household-real", "--sweep-margin", "0.2", "--horizon", "6", "--json"])
    assert run_sim(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["profile"] == "cpu-135m" and report["kv_blocks"] == SERVER_KV_BLOCKS
    assert [r["latency_margin"] for r in report["rows"]] == [0.2]
