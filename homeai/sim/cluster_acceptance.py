"""The cluster's acceptance figures on virtual time (``homeai bench sim --devices``, ``--trace node-leaves``).

Scaling (``--trace household --devices 1,2,4,8``): N households' traffic (``households``: N independent
houses, each with its own overnight job, so background work grows with N) on N devices behind the router.
Per N:

- ``voice_ttft_p99_ratio``: voice TTFT p99 / the same N houses without background on the same N devices;
- ``throughput_tok_s``: useful tokens per second over every class and device (prefill, decode and embedded
  tokens that survive: work a preemption threw away is waste), and ``scaling_efficiency``: that / (N x the
  one-device figure), the one-device figure being N=1's (run whether or not it was asked for). As LLM
  tokens cost ~20x an embedded token, the LLM's and the encoder's efficiencies are also given apart;
- ``lost_requests``: requests that neither ended nor are in flight at the horizon, both runs.

Node leaves (``--trace node-leaves``): one house on two devices (the always-on NAS, device 0, and the gaming
PC, device 1, both with the run's cost profile); device 1 leaves at a third of the horizon and returns, cold,
at two thirds (60 s and 120 s of the default 180 s). ``failed_mid_stream``: requests that were streaming from
it (they end failed, with ``device_left``); ``retried``: placements again of those that had no first token
(queued or prefilling there). ``voice_recovery_s``: for each change, the voice requests it touched (in flight
at the change or arriving before the next one) that missed voice's TTFT target or got no answer; the latest
end of those (its answer's end, its failure, or the horizon), less the change's time; 0 when none missed.
The figure is the worst over the changes.
"""

from __future__ import annotations

from typing import Any

from homeai.policy.schema import Policy
from homeai.sim.cluster_sim import ClusterResult, ClusterSim
from homeai.sim.cost_model import CostModel
from homeai.sim.household import class_figures
from homeai.sim.simulator import RequestRecord
from homeai.sim.trace import household, households

NODE_LEAVES_HORIZON_S = 180.0
BACKGROUND_IN_FLIGHT = 16  # each house's job runner, per background class (the single-device traces' figure)


def _run(policy: Policy, cost: CostModel, num_devices: int, horizon_s: float, seed: int, background: bool,
         kv_blocks: int) -> ClusterResult:
    sim = ClusterSim(policy, cost, num_devices, kv_blocks, BACKGROUND_IN_FLIGHT * num_devices)
    return sim.run(households(num_devices, horizon_s, seed, background), horizon_s)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _throughput(res: ClusterResult, policy: Policy, kind: str | None = None) -> float:
    r = res.result
    names = [c for c in r.processed_tokens if kind is None or (c in policy.classes and policy.classes[c].kind == kind)]
    return sum(r.useful_tokens(c) for c in names) / r.horizon_s


def devices_figures(policy: Policy, cost: CostModel, num_devices: int, horizon_s: float, seed: int,
                    kv_blocks: int = 4096) -> dict[str, Any]:
    """One N: the mix and the idle run, voice's TTFT, throughput by kind, where voice went."""
    mix = _run(policy, cost, num_devices, horizon_s, seed, True, kv_blocks)
    idle = _run(policy, cost, num_devices, horizon_s, seed, False, kv_blocks)
    voice, voice_idle = class_figures(mix.result).get("voice", {}), class_figures(idle.result).get("voice", {})
    voice_placed = [sum(p.device == d for p in mix.placements if p.class_name == "voice")
                    for d in range(num_devices)]
    return {
        "devices": num_devices,
        "voice_ttft_p99_s": voice.get("ttft_p99_s"),
        "voice_ttft_p99_idle_s": voice_idle.get("ttft_p99_s"),
        "voice_ttft_p99_ratio": _ratio(voice.get("ttft_p99_s"), voice_idle.get("ttft_p99_s")),
        "throughput_tok_s": _throughput(mix, policy),
        "llm_tok_s": _throughput(mix, policy, "llm"),
        "embedding_tok_s": _throughput(mix, policy, "embedding"),
        "per_device_tok_s": [n / horizon_s for n in mix.per_device_tokens],
        "voice_placed_per_device": voice_placed,
        "lost_requests": len(mix.result.lost) + len(idle.result.lost),
        "preemptions": mix.result.num_preemptions,
    }


def scaling(policy: Policy, cost: CostModel, devices: tuple[int, ...] = (1, 2, 4, 8), horizon_s: float = 120.0,
            seed: int = 0, kv_blocks: int = 4096) -> dict[str, Any]:
    """Every N of ``devices`` against one device (see the module docstring); the worst of each on top."""
    per = {n: devices_figures(policy, cost, n, horizon_s, seed, kv_blocks) for n in sorted({1, *devices})}
    one = per[1]
    for n, f in per.items():
        for key, figure in (("scaling_efficiency", "throughput_tok_s"), ("llm_scaling_efficiency", "llm_tok_s"),
                            ("embedding_scaling_efficiency", "embedding_tok_s")):
            f[key] = _ratio(f[figure], n * one[figure])
    asked = [per[n] for n in sorted(set(devices))]
    ratios = [f["voice_ttft_p99_ratio"] for f in asked if f["voice_ttft_p99_ratio"] is not None]
    return {
        "profile": cost.name,
        "horizon_s": horizon_s,
        "seed": seed,
        "worst_voice_ttft_p99_ratio": max(ratios) if ratios else None,
        "min_scaling_efficiency": min(f["scaling_efficiency"] for f in asked),
        "min_llm_scaling_efficiency": min(f["llm_scaling_efficiency"] for f in asked),
        "lost_requests": sum(f["lost_requests"] for f in asked),
        "per_devices": {str(f["devices"]): f for f in asked},
    }


def voice_recovery_s(records: list[RequestRecord], changes: list[float], ttft_target_s: float,
                     horizon_s: float, end_s: dict[str, float]) -> list[float]:
    """Per change, how long voice took to be back within its TTFT target (see the module docstring);
    ``end_s``: when each request that ended did (the others count as ending at the horizon)."""
    out = []
    for k, change in enumerate(changes):
        until = changes[k + 1] if k + 1 < len(changes) else horizon_s
        late_ends = []
        for rec in records:
            if rec.req.class_name != "voice" or rec.req.arrival_s >= until:
                continue
            end = end_s.get(rec.rid, horizon_s)
            if rec.req.arrival_s < change and end < change:
                continue  # over before the change
            ttft = None if rec.first_s is None else rec.first_s - rec.req.arrival_s
            if ttft is None or ttft > ttft_target_s or rec.rejected is not None:
                late_ends.append(end)
        out.append(max(0.0, max(late_ends) - change) if late_ends else 0.0)
    return out


def node_leaves(policy: Policy, cost: CostModel, horizon_s: float = NODE_LEAVES_HORIZON_S, seed: int = 0,
                kv_blocks: int = 4096) -> dict[str, Any]:
    """One house on the NAS and the gaming PC; the PC leaves and comes back (see the module docstring)."""
    leave_s, return_s = horizon_s / 3, 2 * horizon_s / 3
    sim = ClusterSim(policy, cost, 2, kv_blocks, BACKGROUND_IN_FLIGHT, changes=((leave_s, 1, "leave"),
                                                                              (return_s, 1, "return")))
    res = sim.run(household(horizon_s, seed), horizon_s)
    target_ms = policy.classes["voice"].targets.ttft_ms if "voice" in policy.classes else None
    target_s = (target_ms or 300) / 1000
    recovery = voice_recovery_s(res.result.records, [leave_s, return_s], target_s, horizon_s, res.end_s)
    voice = class_figures(res.result).get("voice", {})
    return {
        "profile": cost.name,
        "horizon_s": horizon_s,
        "seed": seed,
        "leave_s": leave_s,
        "return_s": return_s,
        "lost_requests": len(res.result.lost),
        "voice_recovery_s": max(recovery),
        "voice_recovery_per_change_s": recovery,
        "voice_ttft_target_s": target_s,
        "voice_ttft_p99_s": voice.get("ttft_p99_s"),
        "failed_mid_stream": res.failed_mid_stream,
        "failed_mid_stream_by_class": res.failed_by_class,
        "retried": res.retried,
        "per_device_tok_s": [n / horizon_s for n in res.per_device_tokens],
    }
