"""The scheduler's acceptance figures (does background work cost voice anything, is anything lost,
does each share hold), trace by trace, on virtual time with our policy.

Each trace runs twice: with its background work and without it (the "idle" run). Per trace:

- ``voice_ttft_p99_ratio``: voice TTFT p99 with background / without (1.0: background costs voice nothing);
- ``voice_itl_p99_over_target``: voice ITL p99 / the voice class's ITL target;
- ``lost_requests``: requests that neither ended (finished, rejected, timed out) nor are still queued or
  running at the horizon, in both runs;
- ``background``: per background class with a ``min_share``, what it got against its entitlement while it
  had work (from its first arrival to the horizon, or to its last completion if it ran dry). An
  embedding class is entitled to min_share of the device's time, an LLM class to min_share of the LLM
  steps' tokens; neither to more than its demand. LLM service counts only computed tokens that survive:
  what a preemption threw away (computed again later) is waste, not service. ``entitlement_ratio`` >= 1
  means the share held;
- ``preemptions``, ``futile_preemptions`` (preemptions that did not make the room they were made for)
  and ``wasted_tokens`` (computed, then thrown away by a preemption), in the run with background.

Every trace runs with the 4,096-block KV pool the traces were written for, and again as
``NAME@kv364``: the pool the server gives float32 weights by default (``kv_cache_mb`` 256, SmolLM2-135M with
a float32 cache: 364 blocks of 16 tokens; the default int4 weights keep a float16 cache, 728 blocks), where
KV pressure, not the step budget, decides who runs. A request that could never fit the pool (a 6,000-token
chat prompt in 364 x 16 tokens) is refused, as the engine refuses it.

``household-real`` (``--trace household-real``) is the server's household as ``homeai bench serve`` sends
it (12 summaries of 1,500 tokens in flight, outputs forced) and runs only at the server's pool, with the
cpu-135m profile unless another is named; each trace also reports voice's time to its NTH_TOKEN-th token.

``household-two-models`` runs the household on two LLMs (voice on a 1B model, chat and the summaries on
an 8B one, each with its own KV pool and gpu costs: ``on_models``), as the server runs several models.

The top level keeps the worst of each over the traces, and sums the counts.
"""

from __future__ import annotations

import copy
from typing import Any

from homeai.policy.schema import Policy
from homeai.sim.cost_model import CostModel, resolve_profile
from homeai.sim.household import class_figures, ours_mapping
from homeai.sim.simulator import SimResult, Simulator
from homeai.sim.trace import TRACE_SETTINGS, TRACES, TraceRequest, TraceSettings

ACCEPTANCE_TRACES = ("household", "cold-background", "index-start", "long-chat-prompts",
                     "search-during-background-window")
TRACE_KV_BLOCKS = 4096  # the pool the traces were written for
SERVER_KV_BLOCKS = 364  # the tighter default pool: kv_cache_mb 256 of SmolLM2-135M float32 KV (int4's float16: 728)


def _run(policy: Policy, cost: CostModel, trace: list[TraceRequest], horizon_s: float, kv_blocks: int,
         background_in_flight: int = TraceSettings().background_in_flight,
         costs: dict[str, CostModel] | None = None) -> SimResult:
    return Simulator(copy.deepcopy(policy), cost, ours_mapping, kv_blocks,
                     background_concurrency=background_in_flight, costs=costs).run(trace, horizon_s)


def on_models(policy: Policy, settings: TraceSettings) -> tuple[Policy, dict[str, CostModel]]:
    """The policy with its LLM classes moved onto the trace's models (``TraceSettings.models``), and each
    model's cost; the policy as it is where the trace names none."""
    if not settings.models:
        return policy, {}
    data = policy.model_dump(mode="json", by_alias=True)
    for name, cp in data["classes"].items():
        if cp["kind"] == "llm":
            cp["model"] = next(model for cls, model, _ in settings.models if cls in (name, "*"))
    for alias in data["aliases"].values():
        alias.pop("model", None)  # an alias follows its class onto its model
    data["models"] = {}  # residency is the server's business: every model stays in the simulator
    return Policy.model_validate(data), {model: resolve_profile(profile) for _, model, profile in settings.models}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def background_figures(policy: Policy, cost: CostModel, res: SimResult) -> dict[str, dict[str, Any]]:
    """Each background class's service against its min_share entitlement (see the module docstring)."""
    llm_tokens = sum(res.useful_tokens(c) for c in res.processed_tokens if c in policy.classes
                     and policy.classes[c].kind == "llm")
    out: dict[str, dict[str, Any]] = {}
    for name, cp in policy.classes.items():
        recs = [r for r in res.records if r.req.class_name == name]
        if not cp.background or cp.min_share <= 0 or not recs:
            continue
        start = min(r.req.arrival_s for r in recs)
        ran_dry = all(r.done_s is not None or r.rejected is not None for r in recs)
        end = max((r.done_s or start) for r in recs) if ran_dry else res.horizon_s
        period_s = max(1e-9, end - start)
        if cp.kind == "embedding":
            demand_s = cost.embed_per_token_s * sum(sum(r.req.input_tokens or []) for r in recs)
            entitled = min(cp.min_share * period_s, demand_s)
            got = res.busy_s.get(name, 0.0)
        else:
            demand = sum(r.req.prompt_tokens + r.req.max_tokens for r in recs)
            entitled = min(cp.min_share * llm_tokens * period_s / res.horizon_s, demand)
            got = float(res.useful_tokens(name))
        out[name] = {"min_share": cp.min_share, "kind": cp.kind, "backlogged_s": period_s,
                     "got": got, "entitled": entitled, "entitlement_ratio": _ratio(got, entitled)}
    return out


def trace_figures(policy: Policy, cost: CostModel, name: str, horizon_s: float, seed: int,
                  kv_blocks: int = TRACE_KV_BLOCKS) -> dict[str, Any]:
    make = TRACES[name]
    settings = TRACE_SETTINGS.get(name, TraceSettings())
    in_flight = settings.background_in_flight
    policy, costs = on_models(policy, settings)
    mix = _run(policy, cost, make(horizon_s, seed, True), horizon_s, kv_blocks, in_flight, costs)
    idle = _run(policy, cost, make(horizon_s, seed, False), horizon_s, kv_blocks, in_flight, costs)
    figs, idle_figs = class_figures(mix), class_figures(idle)
    voice, voice_idle = figs.get("voice", {}), idle_figs.get("voice", {})
    itl_ms = policy.classes["voice"].targets.itl_ms if "voice" in policy.classes else None
    itl_p99 = voice.get("itl_p99_s")
    return {
        "voice_ttft_p99_s": voice.get("ttft_p99_s"),
        "voice_ttft_p99_idle_s": voice_idle.get("ttft_p99_s"),
        "voice_ttft_p99_ratio": _ratio(voice.get("ttft_p99_s"), voice_idle.get("ttft_p99_s")),
        "voice_itl_p99_s": itl_p99,
        "voice_nth_token_p99_s": voice.get("nth_token_p99_s"),
        "voice_nth_token_p99_idle_s": voice_idle.get("nth_token_p99_s"),
        "voice_itl_p99_over_target": _ratio(itl_p99, itl_ms / 1000 if itl_ms else None),
        "lost_requests": len(mix.lost) + len(idle.lost),
        # a voice request that timed out in its queue leaves the TTFT percentiles: counted here instead
        "voice_rejections": voice.get("rejections", 0),
        "background": background_figures(policy, cost, mix),
        "classes": figs,
        "kv_blocks": kv_blocks,
        "preemptions": mix.num_preemptions,
        "futile_preemptions": mix.num_futile_preemptions,
        "wasted_tokens": sum(mix.wasted_tokens.values()),
    }


def trace_key(name: str, kv_blocks: int) -> str:
    """A trace's key in the report: its name with the traces' own pool, ``NAME@kvBLOCKS`` with another."""
    return name if kv_blocks == TRACE_KV_BLOCKS else f"{name}@kv{kv_blocks}"


def _worst(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def acceptance(policy: Policy, cost: CostModel, traces: tuple[str, ...] = ACCEPTANCE_TRACES,
               horizon_s: float = 120.0, seed: int = 0,
               kv_blocks: tuple[int, ...] = (TRACE_KV_BLOCKS, SERVER_KV_BLOCKS)) -> dict[str, Any]:
    """One JSON-able object: per-trace figures (each trace at each pool size) and the worst of each."""
    per = {trace_key(name, blocks): trace_figures(policy, cost, name, horizon_s, seed, blocks)
           for blocks in kv_blocks for name in traces}
    ratios = [b["entitlement_ratio"] for t in per.values() for b in t["background"].values()]
    known = [r for r in ratios if r is not None]
    return {
        "profile": cost.name,
        "horizon_s": horizon_s,
        "seed": seed,
        "worst_voice_ttft_p99_ratio": _worst([t["voice_ttft_p99_ratio"] for t in per.values()]),
        "worst_voice_itl_p99_over_target": _worst([t["voice_itl_p99_over_target"] for t in per.values()]),
        "lost_requests": sum(t["lost_requests"] for t in per.values()),
        "voice_rejections": sum(t["voice_rejections"] for t in per.values()),
        "preemptions": sum(t["preemptions"] for t in per.values()),
        "futile_preemptions": sum(t["futile_preemptions"] for t in per.values()),
        "wasted_tokens": sum(t["wasted_tokens"] for t in per.values()),
        "worst_background_entitlement_ratio": min(known) if known else None,
        "traces": per,
    }
