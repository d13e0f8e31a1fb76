"""`homeai chat MODEL`: talk to a local model through the same engine the server uses."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from homeai.cli import arg_types
from homeai.core.types import SamplingParams

if TYPE_CHECKING:
    from homeai.engine.llm_engine import LLMEngine


def add_chat_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chat", help="chat with a model (streams tokens)")
    p.add_argument("model", help="a name from `homeai models`")
    p.add_argument("-p", "--prompt", help="one-shot: answer this prompt and exit")
    p.add_argument("--system", help="system message")
    p.add_argument("--temperature", type=arg_types.non_negative_float, default=0.7)
    p.add_argument("--top-p", type=arg_types.probability, default=0.95)
    p.add_argument("--max-tokens", type=arg_types.positive_int, default=512)
    p.add_argument("--seed", type=arg_types.seed)
    p.add_argument("--device", type=arg_types.device, help="cuda, cpu (default: cuda when present)")
    p.set_defaults(func=cmd_chat)


class AnswerError(Exception):
    """The engine refused a prompt or ended its answer with an error: one line, the chat goes on."""


def cmd_chat(args: argparse.Namespace) -> int:
    from homeai.engine.builder import EngineConfig, build_llm_engine
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
    # Decode steps stay eager: a chat session is too short to gain from compiling them, and a compile still
    # running in the background at exit held the exit 10 s, then aborted the process (exit 134).
    engine = build_llm_engine(folder, EngineConfig(device=args.device, dtype=entry.dtype,
                                                      max_model_len=entry.served_len,
                                                      quantization=entry.quantization, compile_decode="off"))
    loop = run_alone(engine)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                            seed=args.seed)
    try:
        if args.prompt is not None:
            messages.append({"role": "user", "content": args.prompt})
            return 0 if reply(engine, messages, params) is not None else 1
        return converse(args.model, engine, messages, params)
    except KeyboardInterrupt:
        return 130
    finally:
        loop.shutdown()


def converse(model: str, engine: LLMEngine, messages: list[dict[str, str]], params: SamplingParams) -> int:
    """The interactive loop: a message whose answer failed is dropped, and the conversation goes on."""
    print(f"chatting with {model}; an empty line or Ctrl-D quits", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        drop_oldest_turns(engine, messages, params.max_tokens)
        answer = reply(engine, messages, params)
        if answer is None:
            messages.pop()
        else:
            messages.append({"role": "assistant", "content": answer})


def drop_oldest_turns(engine: LLMEngine, messages: list[dict[str, str]], max_tokens: int) -> None:
    """Forget the oldest exchanges (never the system message nor the new one) until the prompt leaves room
    for an answer: a conversation that outgrew the context was refused at every message after."""
    from homeai.engine.builder import chat_prompt_ids

    max_prompt_tokens = engine.max_model_len - min(max_tokens, engine.max_model_len // 2)
    first = 1 if messages[0]["role"] == "system" else 0
    dropped = 0
    while len(messages) - first > 1 and len(chat_prompt_ids(engine.tokenizer, messages)) > max_prompt_tokens:
        del messages[first:first + 2]  # a user message and its answer
        dropped += 1
    if dropped:
        exchanges = "exchange" if dropped == 1 else f"{dropped} exchanges"
        print(f"(dropped the oldest {exchanges}: the context holds {engine.max_model_len} tokens)", file=sys.stderr)


def reply(engine: LLMEngine, messages: list[dict[str, str]], params: SamplingParams) -> str | None:
    """Stream the answer to ``messages``; None after printing why there is none (one line on stderr)."""
    from homeai.engine.builder import chat_prompt_ids
    from homeai.engine.errors import RequestError
    from homeai.scheduling.class_queue import QueueFullError

    try:
        return asyncio.run(stream(engine, chat_prompt_ids(engine.tokenizer, messages), params))
    except (RequestError, QueueFullError, AnswerError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return None


async def stream(engine: LLMEngine, ids: list[int], params: SamplingParams) -> str:
    """Print the deltas as they come; an error delta raises AnswerError (after the text so far)."""
    text = ""
    async for delta in engine.generate(ids, params):
        text += delta.text
        print(delta.text, end="", flush=True)
        if delta.error is not None:
            if text:
                print()
            raise AnswerError(delta.error)
    print()
    return text
