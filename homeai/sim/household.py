"""The household comparison: our policy against FIFO (Ollama / llama.cpp) and single-queue priority
(vLLM's priority policy), on the same trace and cost model: voice's TTFT and ITL, chat's, and
what the background classes got."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from homeai.policy.loader import load_policy
from homeai.policy.schema import Policy
from homeai.sim.cost_model import CostModel
from homeai.sim.simulator import Mapping, SimResult, Simulator
from homeai.sim.trace import TraceRequest, household

LLM_LEVEL = {"voice": 1, "chat": 2, "summarize": 3}
NTH_TOKEN = 12  # a voice reply's first words: what a speech synthesizer needs to start talking (serve_bench)
EMBED_LEVEL = {"embedding": 1, "indexing": 2}


def single_queue_policy(base: Policy, levels: int) -> Policy:
    """One LLM queue and one embedding queue, no background, with ``levels`` priority levels."""
    sched = base.scheduler.model_dump()
    llm = {"kind": "llm", "model": base.classes["chat"].model, "priority": 0, "max_batch_size": 64,
           "max_queue_delay_microseconds": 0, "priority_levels": levels,
           "default_queue_policy": {"max_queue_size": 0}}
    emb = {"kind": "embedding", "model": base.classes["embedding"].model, "priority": 0, "max_batch_size": 64,
           "max_queue_delay_microseconds": 2000, "priority_levels": min(levels, 2),
           "default_queue_policy": {"max_queue_size": 0}}
    return Policy.model_validate({"version": 1, "classes": {"all": llm, "all-embed": emb},
                                  "users": {"default": {"weight": 1.0}}, "scheduler": sched})


def fifo_mapping(req: TraceRequest) -> tuple[str, int | None, str]:
    return ("all" if req.kind == "llm" else "all-embed", None, "everyone")


def priority_mapping(req: TraceRequest) -> tuple[str, int | None, str]:
    if req.kind == "llm":
        return "all", LLM_LEVEL[req.class_name], "everyone"
    return "all-embed", EMBED_LEVEL[req.class_name], "everyone"


def ours_mapping(req: TraceRequest) -> tuple[str, int | None, str]:
    return req.class_name, None, req.user


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def class_figures(res: SimResult) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for cls in sorted({r.req.class_name for r in res.records}):
        recs = [r for r in res.records if r.req.class_name == cls]
        ttft = [r.first_s - r.req.arrival_s for r in recs if r.first_s is not None]
        nth = [r.token_times[NTH_TOKEN - 1] - r.req.arrival_s for r in recs if len(r.token_times) >= NTH_TOKEN]
        itl = [b - a for r in recs for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
        out[cls] = {
            "requests": len(recs), "completed": sum(r.done_s is not None for r in recs),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "itl_p50_s": _pct(itl, 50), "itl_p99_s": _pct(itl, 99),
            "nth_token_p99_s": _pct(nth, 99),  # the NTH_TOKEN-th token, from arrival
            "tokens_per_s": res.useful_tokens(cls) / res.horizon_s,  # computed and kept
            "wasted_tokens": res.wasted_tokens.get(cls, 0),
            "rejections": sum(r.rejected is not None for r in recs),
        }
    return out


def jain_chat(res: SimResult) -> float:
    """Jain's index of the chat users' served tokens, each normalised by its max-min fair share of
    what chat was served in total (a user who asked for less than an equal share is owed only that)."""
    served: dict[str, float] = {}
    demand: dict[str, float] = {}
    for r in res.records:
        if r.req.class_name != "chat":
            continue
        demand[r.req.user] = demand.get(r.req.user, 0) + r.req.max_tokens
        served[r.req.user] = served.get(r.req.user, 0) + len(r.token_times)
    if len(served) < 2:
        return 1.0
    total, users, fair = sum(served.values()), sorted(demand, key=demand.get), {}  # type: ignore[arg-type]
    for k, u in enumerate(users):  # water-filling
        share = total / (len(users) - k)
        fair[u] = min(demand[u], share)
        total -= fair[u]
    x = np.array([served[u] / fair[u] for u in users if fair[u] > 0])
    return float(x.sum() ** 2 / (len(x) * (x ** 2).sum()))


def _rounded(split: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in sorted(split.items())}


def _run(policy: Policy, mapping: Mapping, cost: CostModel, trace: list[TraceRequest], horizon_s: float,
         kv_blocks: int) -> SimResult:
    return Simulator(copy.deepcopy(policy), cost, mapping, kv_blocks).run(trace, horizon_s)


def compare(policy_path: Path, cost: CostModel, horizon_s: float = 120.0, seed: int = 0,
            kv_blocks: int = 4096) -> dict[str, Any]:
    """Mix, mix without background, background alone: for ours and each baseline."""
    ours = load_policy(policy_path)
    variants: dict[str, tuple[Policy, Mapping]] = {
        "ours": (ours, ours_mapping),
        "fifo": (single_queue_policy(ours, 1), fifo_mapping),
        "priority": (single_queue_policy(ours, 3), priority_mapping),
    }
    mix = household(horizon_s, seed)
    quiet = [r for r in mix if not r.background]
    alone = [r for r in mix if r.background]
    report: dict[str, Any] = {}
    for name, (policy, mapping) in variants.items():
        r_mix = _run(policy, mapping, cost, mix, horizon_s, kv_blocks)
        r_quiet = _run(policy, mapping, cost, quiet, horizon_s, kv_blocks)
        r_alone = _run(policy, mapping, cost, alone, horizon_s, kv_blocks)
        figs = class_figures(r_mix)
        quiet_figs = class_figures(r_quiet)
        # Service is what survives: tokens a preemption threw away (computed again later) are waste.
        bg_mix = sum(r_mix.useful_tokens(c) for c in ("indexing", "summarize"))
        bg_alone = sum(r_alone.useful_tokens(c) for c in ("indexing", "summarize"))
        v_mix, v_quiet = figs["voice"]["ttft_p99_s"], quiet_figs["voice"]["ttft_p99_s"]
        report[name] = {
            "voice_ttft_p99_ratio": (v_mix / v_quiet) if v_mix and v_quiet else None,
            "background_throughput_ratio": bg_mix / bg_alone if bg_alone else None,
            "jain_chat": jain_chat(r_mix),
            "classes": figs,
            "preemptions": r_mix.num_preemptions,
            "futile_preemptions": r_mix.num_futile_preemptions,
            "wasted_tokens": sum(r_mix.wasted_tokens.values()),
            "device_s": {"mix": _rounded(r_mix.device_s), "background_alone": _rounded(r_alone.device_s)},
        }
    out = dict(report["ours"])
    out["profile"] = cost.name
    out["horizon_s"] = horizon_s
    out["baselines"] = {k: v for k, v in report.items() if k != "ours"}
    return out
