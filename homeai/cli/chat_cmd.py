"""`homeai chat MODEL`: talk to a local model through the same engine the server uses."""

from __future__ import annotations

import argparse
import asyncio
import sys

from homeai.cli import arg_types
from homeai.core.types import SamplingParams


def add_chat_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chat", help="chat with a model (streams tokens)")
    p.add_argument("model", help="a name from `homeai models`")
    p.add_argument("-p", "--prompt", help="one-shot: answer this prompt and exit")
    p.add_argument("--system", help="system message")
    p.add_argument("--temperature", type=arg_types.non_negative_float, default=0.7)
    p.add_argument("--top-p", type=arg_types.probability, default=0.95)
    p.add_argument("--max-tokens", type=arg_types.positive_int, default=512)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", type=arg_types.device, help="cuda, cpu (default: cuda when present)")
    p.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    from homeai.engine.builder import EngineConfig, build_llm_engine, chat_prompt_ids
    from homeai.engine.device_loop import run_alone
    from homeai.repository.cache import default_cache_dir
    from homeai.repository.entries import EntryError, get_entry
    from homeai.repository.pull import PullError, pull

    try:
        entry = get_entry(args.model)
        if entry.kind != "llm":
            print(f"{args.model} is an {entry.kind} model, not an LLM", file=sys.stderr)
            return 2
        folder = pull(entry, default_cache_dir())
    except (EntryError, PullError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    engine = build_llm_engine(folder, EngineConfig(device=args.device, dtype=entry.dtype,
                                                      max_model_len=entry.served_len,
                                                      quantization=entry.quantization))
    loop = run_alone(engine)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []

    async def answer() -> str:
        ids = chat_prompt_ids(engine.tokenizer, messages)
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                                seed=args.seed)
        text = ""
        async for delta in engine.generate(ids, params):
            text += delta.text
            print(delta.text, end="", flush=True)
        print()
        return text

    try:
        if args.prompt is not None:
            messages.append({"role": "user", "content": args.prompt})
            asyncio.run(answer())
            return 0
        print(f"chatting with {args.model}; an empty line or Ctrl-D quits", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                return 0
            if not line.strip():
                return 0
            messages.append({"role": "user", "content": line})
            messages.append({"role": "assistant", "content": asyncio.run(answer())})
    except KeyboardInterrupt:
        return 130
    finally:
        loop.shutdown()
