"""The simulator with several LLMs, as the server runs them: each model its own class scheduler, KV pool
and cost model, the one batcher choosing whose step by the models' claims. ``household-two-models`` puts
voice on a 1B model and chat and the summaries on an 8B one (gpu profiles): nothing is lost, each model
steps, and voice's tokens come from its own model's short steps."""

from __future__ import annotations

from homeai.policy.loader import load_policy
from homeai.sim.acceptance import on_models, trace_figures
from homeai.sim.cost_model import resolve_profile
from homeai.sim.household import ours_mapping
from homeai.sim.simulator import Simulator
from homeai.sim.trace import TRACE_SETTINGS, TRACES

DEFAULT = load_policy("policies/default.yaml")


def test_the_policy_moves_onto_the_traces_models() -> None:
    policy, costs = on_models(DEFAULT, TRACE_SETTINGS["household-two-models"])
    models = {name: cp.model for name, cp in policy.classes.items() if cp.kind == "llm"}
    assert models == {"voice": "voice-1b", "chat": "chat-8b", "summarize": "chat-8b"}
    assert costs["voice-1b"].name == "gpu-1b" and costs["chat-8b"].name == "gpu-8b"
    assert on_models(DEFAULT, TRACE_SETTINGS["household-real"]) == (DEFAULT, {})


def test_two_models_each_with_its_own_pool_and_steps() -> None:
    policy, costs = on_models(DEFAULT, TRACE_SETTINGS["household-two-models"])
    sim = Simulator(policy, resolve_profile("gpu-8b"), ours_mapping, 4096, costs=costs)
    steps = {m: 0 for m in sim.schedulers}
    run = sim._llm_step

    def counted(sched):  # type: ignore[no-untyped-def]
        steps[sched.model] += 1
        return run(sched)

    sim._llm_step = counted  # type: ignore[method-assign]
    res = sim.run(TRACES["household-two-models"](15.0, 0, True), 15.0)
    assert not res.lost
    assert steps["voice-1b"] > 0 and steps["chat-8b"] > steps["voice-1b"]
    assert sim.schedulers["voice-1b"].block_manager is not sim.schedulers["chat-8b"].block_manager


def test_household_two_models_figures() -> None:
    figs = trace_figures(DEFAULT, resolve_profile("gpu-8b"), "household-two-models", 20.0, 0)
    assert figs["lost_requests"] == 0
    assert figs["voice_itl_p99_over_target"] is not None and figs["voice_itl_p99_over_target"] < 1.5
    assert figs["classes"]["summarize"]["tokens_per_s"] > 0  # background progresses on the large model
