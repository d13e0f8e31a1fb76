"""`homeai bench sim`: the household mix on virtual time under FIFO, single-queue priority and ours;
``--trace all`` (or one trace's name): the scheduler's acceptance figures over every trace (``sim.acceptance``);
``--sweep-margin`` (and ``--sweep-arrival``): the latency margin's frontier on one trace (``sim.sweep``);
``--devices 1,2,4,8`` (household) and ``--trace node-leaves``: several devices behind the cluster's router
(``sim.cluster_acceptance``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from homeai.policy.loader import load_policy
from homeai.sim.acceptance import ACCEPTANCE_TRACES, TRACE_KV_BLOCKS, acceptance
from homeai.sim.cluster_acceptance import NODE_LEAVES_HORIZON_S, node_leaves, scaling
from homeai.sim.cost_model import PROFILES, resolve_profile
from homeai.sim.household import NTH_TOKEN, compare
from homeai.sim.sweep import sweep
from homeai.sim.trace import TRACE_SETTINGS, TRACES, TraceSettings

DEFAULT_POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


def add_sim_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default="household",
                   choices=["household", "all", NODE_LEAVES, *sorted(set(TRACES) - {"household"})],
                   help="household: ours vs FIFO and priority; all or a trace name: the acceptance figures "
                        "(voice TTFT p99 vs the same trace without background, ITL vs target, lost requests, "
                        "background service vs its min_share, preemptions, futile ones, wasted tokens), each "
                        "trace with a 4,096-block KV pool and with the server's default 364 for float32 weights "
                        "(household-real: the server's household, at 364 blocks only); node-leaves: one house on two "
                        "devices behind the router, the second leaving at a third of the horizon and returning at two "
                        "thirds (lost requests, voice's recovery, failed and retried requests)")
    p.add_argument("--devices", type=_ints, default=None,
                   help="with --trace household: comma-separated device counts (e.g. 1,2,4,8): N houses on N "
                        "devices behind the router, each N against one device (voice TTFT p99 vs no background, "
                        "throughput scaling efficiency, lost requests)")
    p.add_argument("--policy", type=Path, default=DEFAULT_POLICY)
    p.add_argument("--profile", default=None,
                   help=f"cost model: {', '.join(sorted(PROFILES))} or a JSON file from `homeai bench calibrate` "
                        "(default gpu-8b; household-real: cpu-135m)")
    p.add_argument("--sweep-margin", help="comma-separated latency margins (e.g. 0,0.1,0.2,0.4; 'none': no "
                   "margin) set on every interactive LLM class: voice's TTFT p99 ratio, ITL p99, time to its "
                   f"{NTH_TOKEN}th token p99 and background tok/s for each, on --trace (one trace)")
    p.add_argument("--sweep-arrival", help="with --sweep-margin: comma-separated arrival_step_fraction values "
                   "(a background-only step's length as a fraction of the TTFT target) to cross with the margins")
    p.add_argument("--horizon", type=float, default=None,
                   help=f"virtual seconds (default 120; node-leaves: {NODE_LEAVES_HORIZON_S:.0f})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")


NODE_LEAVES = "node-leaves"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated device counts, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"device counts must be positive integers, got {text!r}")
    return values


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f}ms" if isinstance(v, float) else str(v)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_table(report: dict[str, Any]) -> None:
    variants = {"ours": report, **report["baselines"]}
    print(f"household mix, {report['horizon_s']:.0f} s per run, device: {report['profile']}")
    for name, fig in variants.items():
        print(f"\n== {name}: voice_ttft_p99_ratio={_num(fig['voice_ttft_p99_ratio'])} "
              f"background_throughput_ratio={_num(fig['background_throughput_ratio'])} "
              f"jain_chat={_num(fig['jain_chat'])} preemptions={fig['preemptions']} "
              f"futile={fig['futile_preemptions']} wasted_tokens={fig['wasted_tokens']}")
        print(f"{'class':<10} {'ttft p50':>9} {'ttft p99':>9} {'itl p50':>8} {'itl p99':>8} {'tok/s':>9} "
              f"{'done':>6} {'rej':>5}")
        for cls, c in fig["classes"].items():
            print(f"{cls:<10} {_fmt(c['ttft_p50_s']):>9} {_fmt(c['ttft_p99_s']):>9} {_fmt(c['itl_p50_s']):>8} "
                  f"{_fmt(c['itl_p99_s']):>8} {c['tokens_per_s']:>9.0f} {c['completed']:>6} {c['rejections']:>5}")
        for run, split in fig["device_s"].items():
            print(f"device seconds, {run}: " + ", ".join(f"{k} {v:.1f}" for k, v in split.items()))


def print_acceptance(report: dict[str, Any]) -> None:
    print(f"acceptance traces, {report['horizon_s']:.0f} s per run, device: {report['profile']}")
    print(f"{'trace':<40} {'ttft p99/idle':>13} {'itl p99/target':>14} {'lost':>5} {'preempt':>7} "
          f"{'futile':>6} {'wasted':>8}  background got/entitled")
    for name, t in report["traces"].items():
        bg = " ".join(f"{c}={_num(b['entitlement_ratio'])}" for c, b in t["background"].items())
        print(f"{name:<40} {_num(t['voice_ttft_p99_ratio']):>13} {_num(t['voice_itl_p99_over_target']):>14} "
              f"{t['lost_requests']:>5} {t['preemptions']:>7} {t['futile_preemptions']:>6} "
              f"{t['wasted_tokens']:>8}  {bg}")
    print(f"worst: ttft ratio {_num(report['worst_voice_ttft_p99_ratio'])}, itl/target "
          f"{_num(report['worst_voice_itl_p99_over_target'])}, lost {report['lost_requests']}, voice timed out "
          f"{report['voice_rejections']}, background "
          f"{_num(report['worst_background_entitlement_ratio'])}; preemptions {report['preemptions']} "
          f"(futile {report['futile_preemptions']}), wasted tokens {report['wasted_tokens']}")


def _floats(text: str) -> list[float | None]:
    return [None if v.strip().lower() == "none" else float(v) for v in text.split(",") if v.strip()]


def print_sweep(report: dict[str, Any]) -> None:
    print(f"latency margin sweep: {report['trace']}, {report['horizon_s']:.0f} s per run, device: {report['profile']}, "
          f"KV {report['kv_blocks']} blocks; background alone {report['background_alone_tok_s']:.0f} tok/s")
    nth = f"voice_token{NTH_TOKEN}_p99_ms"
    print(f"{'margin':>6} {'arrival':>7} {'voice ttft p99':>15} {'ratio':>6} {'voice itl p99':>14} "
          f"{'token ' + str(NTH_TOKEN) + ' p99':>15} {'chat ttft':>9} {'chat itl':>8} {'bg tok/s':>9} {'bg ratio':>8} "
          f"{'lost':>4} {'futile':>6}")
    for r in report["rows"]:
        ttft = f"{_ms(r['voice_ttft_p99_ms'])}/{_ms(r['voice_ttft_p99_quiet_ms'])}"
        itl = f"{_ms(r['voice_itl_p99_ms'])}/{_ms(r['voice_itl_p99_quiet_ms'])}"
        token = f"{_ms(r[nth])}/{_ms(r[nth.replace('_ms', '_quiet_ms')])}"
        print(f"{_num(r['latency_margin']):>6} {_num(r['arrival_step_fraction']):>7} {ttft:>15} "
              f"{_num(r['voice_ttft_p99_ratio']):>6} {itl:>14} {token:>15} {_ms(r['chat_ttft_p99_ms']):>9} "
              f"{_ms(r['chat_itl_p99_ms']):>8} {r['background_tok_s']:>9.0f} "
              f"{_num(r['background_throughput_ratio']):>8} {r['lost_requests']:>4} {r['futile_preemptions']:>6}")
    print("(mix/quiet house in ms; ratio: voice TTFT p99 with background / without)")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def print_scaling(report: dict[str, Any]) -> None:
    print(f"N households on N devices behind the router, {report['horizon_s']:.0f} s per run, "
          f"device: {report['profile']}")
    print(f"{'devices':>7} {'voice ttft p99':>15} {'ratio':>6} {'tok/s':>9} {'efficiency':>10} {'llm eff':>7} "
          f"{'lost':>5}  voice per device")
    for n, f in report["per_devices"].items():
        ttft = f"{_ms(_scaled(f['voice_ttft_p99_s']))}/{_ms(_scaled(f['voice_ttft_p99_idle_s']))}"
        print(f"{n:>7} {ttft:>15} {_num(f['voice_ttft_p99_ratio']):>6} {f['throughput_tok_s']:>9.0f} "
              f"{_num(f['scaling_efficiency']):>10} {_num(f['llm_scaling_efficiency']):>7} {f['lost_requests']:>5}  "
              f"{f['voice_placed_per_device']}")
    print(f"worst voice ttft ratio {_num(report['worst_voice_ttft_p99_ratio'])}, min scaling efficiency "
          f"{_num(report['min_scaling_efficiency'])}, lost {report['lost_requests']} "
          "(voice ttft in ms: with/without background)")


def print_node_leaves(report: dict[str, Any]) -> None:
    print(f"node leaves: one house on 2 devices, device 1 leaves at {report['leave_s']:.0f} s and returns at "
          f"{report['return_s']:.0f} s of {report['horizon_s']:.0f} s, device: {report['profile']}")
    recovery = ", ".join(f"{v:.2f}" for v in report["voice_recovery_per_change_s"])
    print(f"lost {report['lost_requests']}, failed mid-stream {report['failed_mid_stream']} "
          f"{report['failed_mid_stream_by_class']}, retried {report['retried']}, voice recovery "
          f"{report['voice_recovery_s']:.2f} s (per change: {recovery}), voice ttft p99 "
          f"{_ms(_scaled(report['voice_ttft_p99_s']))} ms")


def _scaled(v: float | None) -> float | None:
    return None if v is None else v * 1000


def _print(report: dict[str, Any], as_json: bool, table: Any) -> int:
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        table(report)
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    """``--devices`` (household) or ``--trace node-leaves``: several devices behind the router."""
    policy = load_policy(args.policy)
    profile = resolve_profile(args.profile or "gpu-8b")
    if args.trace == NODE_LEAVES:
        return _print(node_leaves(policy, profile, args.horizon or NODE_LEAVES_HORIZON_S, args.seed),
                      args.json, print_node_leaves)
    if args.trace != "household":
        raise SystemExit("--devices runs the household trace (--trace household)")
    return _print(scaling(policy, profile, tuple(args.devices), args.horizon or 120.0, args.seed),
                  args.json, print_scaling)


def run_sim(args: argparse.Namespace) -> int:
    if args.devices is not None or args.trace == NODE_LEAVES:
        if args.sweep_margin is not None:
            raise SystemExit("--sweep-margin runs on one device: drop --devices")
        return run_cluster(args)
    args.horizon = args.horizon or 120.0
    settings = TRACE_SETTINGS.get(args.trace, TraceSettings())
    profile = resolve_profile(args.profile or settings.profile or "gpu-8b")
    if args.sweep_margin is not None:
        if args.trace == "all":
            raise SystemExit("--sweep-margin runs one trace: name it with --trace")
        report = sweep(load_policy(args.policy), profile, args.trace, _floats(args.sweep_margin),
                       _floats(args.sweep_arrival) if args.sweep_arrival else None, args.horizon, args.seed,
                       settings.kv_blocks or TRACE_KV_BLOCKS)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_sweep(report)
        return 0
    if args.trace != "household":
        traces = ACCEPTANCE_TRACES if args.trace == "all" else (args.trace,)
        blocks = (settings.kv_blocks,) if settings.kv_blocks else None
        result = acceptance(load_policy(args.policy), profile, traces, args.horizon, args.seed,
                            **({"kv_blocks": blocks} if blocks else {}))
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print_acceptance(result)
        return 0
    report = compare(args.policy, profile, args.horizon, args.seed)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0
