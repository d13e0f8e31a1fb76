"""The planner's step cost model predicts a step from its rows, tokens and context (a tokens-only
model misjudged a step of many decode rows or long contexts, so the planner could not bound it): decode rows
and prompt tokens cost differently, attention grows with the context, and the online fit learns each
slope the steps seen vary (a slope they do not vary keeps the seed's value)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from homeai.scheduling.step_budget import StepCostModel, load_step_cost

TRUE = {"base_s": 0.02, "per_token_s": 0.0012, "prompt_token_s": 0.0007, "per_ctx_s": 5e-7}


def true_s(tokens: int, rows: int, ctx: int) -> float:
    return TRUE["base_s"] + TRUE["per_token_s"] * rows + TRUE["prompt_token_s"] * (tokens - rows) \
        + TRUE["per_ctx_s"] * ctx


def test_a_step_is_predicted_from_its_rows_tokens_and_context() -> None:
    cost = StepCostModel(**TRUE)
    assert abs(cost.predict_s(1, 1, 100) - (0.02 + 0.0012 + 5e-5)) < 1e-12  # one decode row
    assert abs(cost.predict_s(64, 1, 64) - (0.02 + 0.0012 + 63 * 0.0007 + 64 * 5e-7)) < 1e-12  # a prompt chunk
    # the tokens-only view (an embedding batch, the budget) counts every token as a row: the older model
    assert cost.step_s(10) == cost.predict_s(10, 10) and StepCostModel(0.02, 0.001).prompt_token_s == 0.001


def test_the_online_fit_learns_rows_prompt_tokens_and_context_from_mixed_steps() -> None:
    """Seeded with a generic guess, a few dozen steps of decodes, prompt chunks and both together bring
    every coefficient to the device's (within a few percent)."""
    cost = StepCostModel(base_s=0.05, per_token_s=0.004)
    rng = random.Random(0)
    for _ in range(80):
        rows = rng.randint(1, 24)
        prompt = rng.choice([0, 0, 16, 64, 200])
        tokens = rows + prompt
        ctx = sum(rng.randint(50, 1500) for _ in range(rows)) + prompt
        cost.observe(tokens, true_s(tokens, rows, ctx), rows, ctx)
    assert abs(cost.base_s - 0.02) < 0.001
    assert abs(cost.per_token_s - 0.0012) < 0.0001
    assert abs(cost.prompt_token_s - 0.0007) < 0.00005  # type: ignore[operator]
    assert abs(cost.per_ctx_s - 5e-7) < 1e-7
    assert abs(cost.predict_s(12, 12, 12 * 1500) - true_s(12, 12, 12 * 1500)) < 0.001


def test_a_slope_the_steps_do_not_vary_keeps_the_seed() -> None:
    """Only decode steps (rows == tokens, no context reported): the prompt-token slope and the context
    slope stay the seed's, the base and the row cost are learnt."""
    cost = StepCostModel(base_s=0.05, per_token_s=0.004, prompt_token_s=0.003, per_ctx_s=1e-6)
    for rows in [1, 4, 8, 16, 2, 12] * 10:
        cost.observe(rows, 0.02 + 0.0012 * rows, rows, 0)
    assert abs(cost.base_s - 0.02) < 0.001 and abs(cost.per_token_s - 0.0012) < 0.0001
    assert abs(cost.prompt_token_s - 0.003) < 1e-4 and abs(cost.per_ctx_s - 1e-6) < 1e-7  # type: ignore[operator]


def test_a_calibration_seeds_prompt_tokens_and_context_apart_from_rows(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"name": "c", "base_s": 0.19, "per_token_s": 0.004, "per_seq_s": 0.002,
                                "per_ctx_token_s": 1e-6, "embed_base_s": 0.0, "embed_per_token_s": 0.0003}))
    cost = load_step_cost(path)
    assert cost is not None
    assert abs(cost.per_token_s - 0.006) < 1e-12 and cost.prompt_token_s == 0.004 and cost.per_ctx_s == 1e-6


def trained() -> StepCostModel:
    cost = StepCostModel(**TRUE)
    rng = random.Random(1)
    for _ in range(60):
        rows = rng.randint(1, 16)
        prompt = rng.choice([0, 0, 16, 64])
        ctx = sum(rng.randint(50, 800) for _ in range(rows)) + prompt
        cost.observe(rows + prompt, true_s(rows + prompt, rows, ctx), rows, ctx)
    return cost


def test_one_stalled_step_barely_moves_the_fit() -> None:
    """A step another process stalled (20x its length) made the next steps' prediction 2.6x what it was,
    shrinking their budgets for ~30 steps; it now counts as OUTLIER_FACTOR times its prediction (1.1x)."""
    cost = trained()
    before = cost.predict_s(8, 8, 3000)
    cost.observe(8, 20 * true_s(8, 8, 3000), 8, 3000)
    assert cost.predict_s(8, 8, 3000) < 1.25 * before


def test_a_device_that_really_got_slower_is_learned_within_a_few_dozen_steps() -> None:
    cost = trained()
    before = cost.predict_s(8, 8, 3000)
    for _ in range(40):
        cost.observe(8, 4 * true_s(8, 8, 3000), 8, 3000)
    assert cost.predict_s(8, 8, 3000) > 3 * before
