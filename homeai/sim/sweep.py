"""The latency margin's frontier on virtual time: how fast voice is served against how much the
background gets, one policy setting at a time (`homeai bench sim --sweep-margin ...`).

For each setting (a ``latency_margin`` on every interactive LLM class, and optionally their
``arrival_step_fraction``) the trace runs with its background and without it (the quiet house); a row
reports voice's TTFT p99 (and its ratio to the quiet house), ITL p99, the time to its NTH_TOKEN-th token
p99, chat's TTFT and ITL p99, and the background's tokens per second that survive (per class, and
against the background running alone, which the interactive classes' settings cannot change).
"""

from __future__ import annotations

from typing import Any

from homeai.policy.schema import Policy
from homeai.sim.acceptance import _ratio, _run
from homeai.sim.cost_model import CostModel
from homeai.sim.household import NTH_TOKEN, class_figures
from homeai.sim.simulator import SimResult
from homeai.sim.trace import TRACE_SETTINGS, TRACES, TraceSettings


def with_margin(policy: Policy, margin: float | None, arrival: float | None = None) -> Policy:
    """``policy`` with ``latency_margin`` (and ``arrival_step_fraction``, where given and the class has a
    TTFT target) set on every interactive LLM class, each keeping its ``margin_between_steps``; ``margin``
    None leaves every class unguarded."""
    doc = policy.model_dump(by_alias=True)
    for name, cp in policy.classes.items():
        if cp.kind != "llm" or cp.background:
            continue
        fields = doc["classes"][name]
        fields["latency_margin"] = margin
        if margin is None:
            fields["margin_between_steps"] = False
            fields["arrival_step_fraction"] = None
        elif arrival is not None and cp.targets.ttft_ms:
            fields["arrival_step_fraction"] = arrival
    return Policy.model_validate(doc)


def _background_tok_s(policy: Policy, res: SimResult) -> dict[str, float]:
    return {name: res.useful_tokens(name) / res.horizon_s for name, cp in policy.classes.items()
            if cp.background and name in res.processed_tokens}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 1)


def sweep(policy: Policy, cost: CostModel, trace: str, margins: list[float | None],
          arrivals: list[float | None] | None = None, horizon_s: float = 120.0, seed: int = 0,
          kv_blocks: int = 4096) -> dict[str, Any]:
    """One row per (margin, arrival fraction): the figures in the module docstring."""
    settings = TRACE_SETTINGS.get(trace, TraceSettings())
    make = TRACES[trace]
    mix_trace, quiet_trace = make(horizon_s, seed, True), make(horizon_s, seed, False)
    alone = _run(policy, cost, [r for r in mix_trace if r.background], horizon_s, kv_blocks,
                 settings.background_in_flight)
    alone_tok_s = sum(_background_tok_s(policy, alone).values())
    rows = []
    for margin in margins:
        for arrival in (arrivals or [None]) if margin is not None else [None]:
            p = with_margin(policy, margin, arrival)
            mix = _run(p, cost, mix_trace, horizon_s, kv_blocks, settings.background_in_flight)
            quiet = _run(p, cost, quiet_trace, horizon_s, kv_blocks, settings.background_in_flight)
            figs, quiet_figs = class_figures(mix), class_figures(quiet)
            voice, voice_q = figs.get("voice", {}), quiet_figs.get("voice", {})
            chat = figs.get("chat", {})
            bg = _background_tok_s(p, mix)
            rows.append({
                "latency_margin": margin,
                "arrival_step_fraction": None if margin is None else (
                    arrival if arrival is not None else p.classes["voice"].arrival_fraction
                    if "voice" in p.classes else None),
                "voice_ttft_p99_ms": _ms(voice.get("ttft_p99_s")),
                "voice_ttft_p99_quiet_ms": _ms(voice_q.get("ttft_p99_s")),
                "voice_ttft_p99_ratio": _ratio(voice.get("ttft_p99_s"), voice_q.get("ttft_p99_s")),
                "voice_itl_p99_ms": _ms(voice.get("itl_p99_s")),
                "voice_itl_p99_quiet_ms": _ms(voice_q.get("itl_p99_s")),
                f"voice_token{NTH_TOKEN}_p99_ms": _ms(voice.get("nth_token_p99_s")),
                f"voice_token{NTH_TOKEN}_p99_quiet_ms": _ms(voice_q.get("nth_token_p99_s")),
                "chat_ttft_p99_ms": _ms(chat.get("ttft_p99_s")),
                "chat_itl_p99_ms": _ms(chat.get("itl_p99_s")),
                "background_tok_s": round(sum(bg.values()), 1),
                "background_tok_s_by_class": {k: round(v, 1) for k, v in bg.items()},
                "background_throughput_ratio": _ratio(sum(bg.values()), alone_tok_s),
                "lost_requests": len(mix.lost) + len(quiet.lost),
                "preemptions": mix.num_preemptions,
                "futile_preemptions": mix.num_futile_preemptions,
            })
    return {"trace": trace, "profile": cost.name, "horizon_s": horizon_s, "seed": seed, "kv_blocks": kv_blocks,
            "background_alone_tok_s": round(alone_tok_s, 1), "rows": rows}
