"""The step planner starts from this machine's calibration (`homeai bench calibrate` writes it to the cache
dir), not from a generic default: the first steps on a slow CPU are already sized for it."""

from __future__ import annotations

import json
from pathlib import Path

from homeai.scheduling.step_budget import MIN_STEP_TOKENS, StepCostModel, load_step_cost


def _calibration(tmp_path: Path, **fields: float) -> Path:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"name": "calibrated-cpu", "base_s": 0.19, "per_token_s": 0.004, "per_seq_s": 0.002,
                                "per_ctx_token_s": 0.0, "embed_base_s": 0.0, "embed_per_token_s": 0.0003, **fields}))
    return path


def test_a_calibration_seeds_the_step_cost_with_a_decode_costing_token_plus_sequence(tmp_path: Path) -> None:
    cost = load_step_cost(_calibration(tmp_path))
    assert cost is not None
    assert cost.base_s == 0.19 and abs(cost.per_token_s - 0.006) < 1e-12
    # the seed's budget for a 60 ms step is already the floor, not the generic default's 50 tokens
    assert cost.tokens_within(0.06) == 0 and StepCostModel().tokens_within(0.06) > MIN_STEP_TOKENS


def test_the_online_fit_takes_over_from_the_seed(tmp_path: Path) -> None:
    cost = load_step_cost(_calibration(tmp_path))
    assert cost is not None
    for n in [1, 64, 512, 8, 256, 100] * 10:
        cost.observe(n, 0.05 + 0.001 * n)
    assert abs(cost.base_s - 0.05) < 0.01 and abs(cost.per_token_s - 0.001) < 0.0002


def test_no_calibration_or_an_unreadable_one_leaves_the_default(tmp_path: Path) -> None:
    assert load_step_cost(tmp_path / "missing.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert load_step_cost(bad) is None
    assert load_step_cost(_calibration(tmp_path, per_token_s=0.0, per_seq_s=0.0)) is None
