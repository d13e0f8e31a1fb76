"""`homeai bench engine|sim|calibrate|soak|prefix|kernels`: measured figures, printed as tables or one JSON object."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from homeai.bench.shapes import SHAPES
from homeai.cli import arg_types


def add_bench_commands(subparsers: Any) -> None:
    """Register ``bench`` with its sub-benchmarks; each sets ``func(args) -> int``."""
    bench = subparsers.add_parser("bench", help="benchmarks (print figures; never pass/fail)")
    kinds = bench.add_subparsers(dest="bench", required=True)
    p = kinds.add_parser("engine", help="our engine vs transformers' generate: tokens/s, TTFT, roofline")
    p.add_argument("--model", default="smollm2-135m-instruct", help="an LLM from `homeai models`")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrencies (default 1,8,32)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--workloads", default="uniform,mixed", help="uniform, mixed or both (default both)")
    p.add_argument("--quick", action="store_true", help="few short requests: a smoke test, not a measurement")
    p.add_argument("--max-tokens", type=int, default=16, help="with --quick: uniform output length")
    p.add_argument("--threads", type=int, help="torch CPU threads (default HOMEAI_CPU_THREADS or all cores)")
    p.add_argument("--trace", choices=["household"], help="instead: the household mix, shortened, ours vs FIFO")
    p.add_argument("--horizon", type=float, default=30.0, help="with --trace: seconds per run (6 runs)")
    p.set_defaults(func=cmd_bench_engine)

    from homeai.bench.calibrate import add_calibrate_arguments, run_calibrate
    from homeai.bench.prefix_bench import add_prefix_arguments, run_prefix
    from homeai.bench.sim_bench import add_sim_arguments, run_sim

    p = kinds.add_parser("sim", help="the household mix on virtual time: FIFO vs single-queue priority vs ours")
    add_sim_arguments(p)
    p.set_defaults(func=run_sim)
    p = kinds.add_parser("calibrate", help="fit the simulator's cost model on this machine's real runtime")
    add_calibrate_arguments(p)
    p.set_defaults(func=run_calibrate)
    from homeai.cli.speed_cmd import add_speed_commands

    add_speed_commands(kinds)
    p = kinds.add_parser("kernels", help="int8 and int4 matmul kernels side by side on one model's weight shapes")
    p.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES), help="whose weight shapes")
    p.add_argument("--rows", type=arg_types.positive_ints, default="1,2,4,8,16,32,64",
                   help="activation rows (decode batch sizes)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--attention", metavar="ROWSxCONTEXT,...",
                   help="the decode-attention kernel instead, per cache type (e.g. 1x1700,12x1700,16x200)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_kernels)
    p = kinds.add_parser("prefix", help="prefix caching: warm vs cold TTFT of a long system prompt, a voice trace")
    add_prefix_arguments(p)
    p.set_defaults(func=run_prefix)
    from homeai.bench.serve_bench import add_serve_arguments, run_serve

    p = kinds.add_parser("serve", help="the acceptance bench over HTTP: `homeai serve` as a user runs it, or --url")
    add_serve_arguments(p)
    p.set_defaults(func=run_serve)
    p = kinds.add_parser("soak", help="every class at once against a real server, then what leaked")
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--work-dir", type=Path, help="keep the server's data, the notes and its log here "
                   "(default: a temporary folder, removed afterwards)")
    p.add_argument("--seed", type=int, default=0, help="seed of the clients' choices")
    p.set_defaults(func=cmd_bench_soak)


def cmd_bench_kernels(args: argparse.Namespace) -> int:
    from homeai.bench.kernel_bench import run_kernel_bench  # torch: only when this bench runs

    return run_kernel_bench(args)


def cmd_bench_soak(args: argparse.Namespace) -> int:
    """Start a server of our own on loopback, soak it, print the report (the server stops after)."""
    from homeai.bench.soak import SoakConfig, run_soak
    from homeai.bench.soak_server import soak_server

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        work_dir = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="homeai-soak-")))
        log(f"soak: starting a server in {work_dir}")
        server = stack.enter_context(soak_server(work_dir))
        report = run_soak(SoakConfig(server.url, server.pid, server.database_url, work_dir, args.minutes,
                                     seed=args.seed), log)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from homeai.bench.engine_bench import BenchConfig, format_bounds, run_bench
    from homeai.bench.pulled_llm import pulled_llm_folder

    try:
        concurrency = sorted({int(c) for c in args.concurrency.split(",") if c.strip()})
        if not concurrency or min(concurrency) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --concurrency wants positive integers like 1,8,32, got {args.concurrency!r}",
              file=sys.stderr)
        return 2
    folder = pulled_llm_folder(args.model, quiet=args.json)
    if isinstance(folder, int):
        return folder
    if args.trace:
        return _household_engine(args, folder, log=lambda m: print(m, file=sys.stderr, flush=True))
    cfg = BenchConfig.quick(concurrency, args.max_tokens) if args.quick else BenchConfig(concurrency)
    cfg.workloads = tuple(w for w in args.workloads.split(",") if w in ("uniform", "mixed")) or ("uniform",)
    def log(msg: str) -> None:  # progress lines; with --json they go to stderr so stdout stays one object
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    out = run_bench(folder, cfg, args.threads, log=log)
    out["model"] = args.model
    if args.json:
        print(json.dumps(out, indent=None))
    else:
        print(format_bounds(out))
    return 0


def _household_engine(args: argparse.Namespace, llm_folder: Any, log: Any) -> int:
    from homeai.bench.household_engine import run_household_engine
    from homeai.bench.sim_bench import DEFAULT_POLICY, print_table
    from homeai.repository.cache import default_cache_dir
    from homeai.repository.entries import get_entry
    from homeai.repository.pull import pull
    from homeai.scheduling.step_budget import CALIBRATION_FILE

    if args.threads:  # on a busy shared CPU, fewer threads avoid OpenMP stalls
        import os

        import torch

        os.environ["HOMEAI_CPU_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    embed_folder = pull(get_entry("all-minilm-l6-v2"), default_cache_dir(), progress=not args.json)
    report = run_household_engine(DEFAULT_POLICY, llm_folder, embed_folder, "all-minilm-l6-v2", args.horizon, log,
                                  calibration=default_cache_dir() / CALIBRATION_FILE)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0
