"""`homeai bench speed` and `homeai bench quant`: per weight format speed, and int8 quality against fp32."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from homeai.cli import arg_types


def add_speed_commands(kinds: Any) -> None:
    """Register ``speed`` and ``quant`` under ``homeai bench``."""
    p = kinds.add_parser("speed", help="decode tok/s, bandwidth share and idle TTFT per weight format")
    p.add_argument("--model", default="smollm2-135m-instruct", help="an LLM from `homeai models`")
    p.add_argument("--shape", help="instead of --model: random weights of this shape (smollm2-135m, llama-3.2-1b)")
    p.add_argument("--device", type=arg_types.device, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--dtype", help="float32, bfloat16, ... (default: bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--formats", default="none,int8", help="weight formats, the first is the baseline")
    p.add_argument("--batch", type=arg_types.positive_ints, default="1,16", help="decode batch sizes (default 1,16)")
    p.add_argument("--steps", type=arg_types.positive_int, default=24, help="timed decode steps per batch size")
    p.add_argument("--compile", action="store_true",
                   help="also each format with compiled decode steps (FORMAT+compiled; compiling takes minutes)")
    p.add_argument("--transformers", action="store_true", help="also transformers' generate, same weights")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_speed)
    q = kinds.add_parser("quant", help="int8 and int4 against float32: greedy agreement over N prompts x T tokens")
    q.add_argument("--model", default="smollm2-135m-instruct")
    q.add_argument("--prompts", type=arg_types.positive_int, default=50)
    q.add_argument("--tokens", type=arg_types.positive_int, default=32)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_quant)


def _log(args: argparse.Namespace) -> Any:
    return lambda msg: print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)


def cmd_speed(args: argparse.Namespace) -> int:
    from homeai.bench.pulled_llm import pulled_llm_folder
    from homeai.bench.speed_bench import SHAPES, headline, run_speed
    from homeai.runtime.device import choose_device, parse_dtype

    if args.shape is not None and args.shape not in SHAPES:
        print(f"error: --shape must be one of {sorted(SHAPES)}", file=sys.stderr)
        return 2
    source = args.shape or pulled_llm_folder(args.model, quiet=args.json)
    if isinstance(source, int):  # an unknown model or a failed pull: its line is printed
        return source
    device = choose_device(args.device)
    formats = args.formats.split(",")
    if args.compile:
        formats += [f + "+compiled" for f in formats]
    out = run_speed(source, device, parse_dtype(args.dtype, device), formats, args.batch, args.steps, log=_log(args),
                    with_transformers=args.transformers)
    out.update(headline(out))
    if args.json:
        print(json.dumps(out))
    return 0


def cmd_quant(args: argparse.Namespace) -> int:
    import torch

    from homeai.bench.pulled_llm import pulled_llm_folder
    from homeai.bench.quant_quality import chat_prompts, measure_agreement, word_prompts
    from homeai.engine.builder import load_tokenizer
    from homeai.runtime.llama import LlamaModel

    folder = pulled_llm_folder(args.model, quiet=args.json)
    if isinstance(folder, int):  # an unknown model or a failed pull: its line is printed
        return folder
    tokenizer, cpu = load_tokenizer(folder), torch.device("cpu")
    dense = LlamaModel.from_folder(folder, cpu, torch.float32, "none")
    out: dict[str, Any] = {"model": args.model, "prompts": args.prompts, "tokens": args.tokens}
    for fmt in ("int8", "int4"):
        candidate = LlamaModel.from_folder(folder, cpu, torch.float32, fmt)
        for kind, prompts in (("chat", chat_prompts(tokenizer, args.prompts)),
                              ("words", word_prompts(tokenizer, args.prompts))):
            key = kind if fmt == "int8" else f"{fmt}_{kind}"  # the int8 keys keep their names
            out[key] = measure_agreement(dense, candidate, prompts, args.tokens).as_dict()
            _log(args)(f"{fmt} {kind}: {out[key]}")
    if args.json:
        print(json.dumps(out))
    return 0
