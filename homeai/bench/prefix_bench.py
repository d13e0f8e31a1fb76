"""What prefix caching buys a Home Assistant household: the same long system prompt on every voice turn.

    homeai bench prefix [--json] [--quick] [--system-tokens 1500] [--turns 16] [--uncached-turns 3]

1. ``warm_ttft_ratio``: TTFT of a request whose system prompt (about 1,500 tokens: instructions and the
   exposed devices, as Home Assistant sends them) was served just before, over the TTFT of the same kind
   of request with a system prompt the cache has never seen, on one engine (medians of a few pairs).
2. A voice trace: one system prompt, ``turns`` different user commands, one after another (a voice
   satellite waits for each answer). Run once with prefix caching and once without, each on a fresh
   engine: ``hit_rate`` is the share of prompt tokens served from the cache (first turn included), and
   voice TTFT p50 with and without caching. Without caching every turn costs the same full prefill, so
   that run takes fewer turns (``--uncached-turns``) to keep the benchmark short on a shared machine.

The engine is stepped synchronously in this process (no server, no device thread), so a TTFT is the
time from adding a request to its first sampled token. Ratios from one run are what count on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from homeai.core.types import SamplingParams

AREAS = ("Kitchen", "Living Room", "Bedroom", "Kids Room", "Bathroom", "Hallway", "Garage", "Garden",
         "Office", "Basement", "Attic", "Laundry")
DEVICES = (("Ceiling Light", "light", "off"), ("Lamp", "light", "on"), ("Blinds", "cover", "closed"),
           ("Thermostat", "climate", "heat"), ("Speaker", "media_player", "idle"), ("Window", "binary_sensor",
           "off"), ("Temperature", "sensor", "21.5 °C"), ("Smoke Detector", "binary_sensor", "off"))
TURNS = ("turn on the kitchen ceiling light", "what is the temperature in the office",
         "close the bedroom blinds", "set the living room thermostat to 21 degrees",
         "is the garage window open", "turn off all the lights in the kids room", "play music in the kitchen",
         "dim the hallway lamp to thirty percent", "open the garden blinds halfway",
         "what's the temperature in the basement", "turn off the speaker in the office",
         "is the smoke detector in the attic ok", "turn on the laundry lamp", "close all the blinds",
         "what lights are on right now", "set the bedroom thermostat to eighteen")
INSTRUCTIONS = ("You are a voice assistant for Home Assistant.\nAnswer questions about the world truthfully.\n"
                "Answer in plain text. Keep it simple and to the point.\n"
                "When controlling Home Assistant always call the intent tools. Use HassTurnOn to lock and "
                "HassTurnOff to unlock a lock. When controlling a device, prefer passing just name and "
                "domain. When controlling an area, prefer passing just area name and domain.\n"
                "Static Context: An overview of the areas and the devices in this smart home:\n")


def add_prefix_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct", help="an LLM from `homeai models`")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--quick", action="store_true", help="a short prompt and 4 turns: a smoke test, not a measurement")
    p.add_argument("--system-tokens", type=int, default=1500, help="system prompt length (default 1500)")
    p.add_argument("--turns", type=int, default=len(TURNS), help=f"voice turns (default {len(TURNS)})")
    p.add_argument("--uncached-turns", type=int, default=3, help="voice turns without caching (default 3)")
    p.add_argument("--pairs", type=int, default=2, help="cold/warm pairs for warm_ttft_ratio (default 2)")


def system_prompt(tokenizer: Any, num_tokens: int, home: int = 0) -> str:
    """Instructions and a device list (YAML, as Home Assistant renders it) of about ``num_tokens``
    tokens. ``home`` names a different household: a prompt the cache has never seen."""
    lines = [f"Home #{home}. " + INSTRUCTIONS]
    i = 0
    while len(tokenizer("".join(lines)).input_ids) < num_tokens:
        name, domain, state = DEVICES[i % len(DEVICES)]
        area = AREAS[(i // len(DEVICES)) % len(AREAS)]
        lines.append(f"- names: {area} {name}\n  domain: {domain}\n  state: '{state}'\n  areas: {area}\n")
        i += 1
    return "".join(lines)


def prompt_ids(tokenizer: Any, system: str, turn: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": turn}],
                                        add_generation_prompt=True, tokenize=True)
    return list(ids)


def ttft_s(engine: Any, ids: list[int]) -> float:
    """Add one request to an idle engine and step it until its first token (max_tokens 1: it ends there)."""
    seq = engine.make_sequence(ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    t0 = time.perf_counter()
    engine.scheduler.add(seq)
    while engine.scheduler.has_work():
        engine.step()
    assert seq.num_output_tokens == 1, "the request did not produce its token"
    return time.perf_counter() - t0


def hit_counts(engine: Any) -> tuple[int, int, int, int]:
    """(hit tokens, prompt tokens, hit requests, requests) over every class."""
    stats = engine.scheduler.block_manager.stats.snapshot().values()
    return (sum(int(c["num_hit_tokens"]) for c in stats), sum(int(c["num_prompt_tokens"]) for c in stats),
            sum(int(c["num_hit_requests"]) for c in stats), sum(int(c["num_requests"]) for c in stats))


def build(folder: Path, caching: bool) -> Any:
    from homeai.engine.builder import EngineConfig, build_llm_engine

    engine = build_llm_engine(folder, EngineConfig(device="cpu", dtype="float32", kv_cache_mb=256,
                                                   enable_prefix_caching=caching, max_model_len=4096))
    ttft_s(engine, prompt_ids(engine.tokenizer, "You are helpful.", "hi"))  # warm-up: first-call costs
    return engine


def warm_ratio(folder: Path, system_tokens: int, pairs: int, log: Any) -> dict[str, Any]:
    engine = build(folder, caching=True)
    cold, warm = [], []
    for k in range(pairs):
        system = system_prompt(engine.tokenizer, system_tokens, home=k + 1)
        cold.append(ttft_s(engine, prompt_ids(engine.tokenizer, system, TURNS[k % len(TURNS)])))
        warm.append(ttft_s(engine, prompt_ids(engine.tokenizer, system, TURNS[(k + 1) % len(TURNS)])))
        log(f"pair {k + 1}: cold {cold[-1] * 1e3:.0f} ms, warm {warm[-1] * 1e3:.0f} ms")
    system_len = len(engine.tokenizer(system_prompt(engine.tokenizer, system_tokens, home=1)).input_ids)
    cold_ms, warm_ms = statistics.median(cold) * 1e3, statistics.median(warm) * 1e3
    return {"system_prompt_tokens": system_len, "cold_ttft_ms": round(cold_ms, 1),
            "warm_ttft_ms": round(warm_ms, 1), "warm_ttft_ratio": round(warm_ms / cold_ms, 4)}


def voice_trace(folder: Path, system_tokens: int, turns: int, caching: bool, log: Any) -> dict[str, Any]:
    engine = build(folder, caching)
    before = hit_counts(engine)
    system = system_prompt(engine.tokenizer, system_tokens)
    times = [ttft_s(engine, prompt_ids(engine.tokenizer, system, TURNS[i % len(TURNS)])) for i in range(turns)]
    hit_tokens, prompt_tokens, hit_reqs, reqs = (a - b for a, b in zip(hit_counts(engine), before, strict=True))
    p50_ms = statistics.median(times) * 1e3
    log(f"voice trace, caching {'on' if caching else 'off'}: TTFT p50 {p50_ms:.0f} ms over {turns} turns")
    return {"ttft_p50_ms": round(p50_ms, 1), "hit_rate": hit_tokens / prompt_tokens if prompt_tokens else 0.0,
            "request_hit_rate": hit_reqs / reqs if reqs else 0.0}


def run_prefix_bench(folder: Path, system_tokens: int, turns: int, uncached_turns: int, pairs: int,
                     log: Any) -> dict[str, Any]:
    out = warm_ratio(folder, system_tokens, pairs, log)
    cached = voice_trace(folder, system_tokens, turns, True, log)
    uncached = voice_trace(folder, system_tokens, uncached_turns, False, log)
    return out | {"voice_turns": turns, "voice_turns_uncached": uncached_turns,
                  "hit_rate": round(cached["hit_rate"], 4),
                  "request_hit_rate": round(cached["request_hit_rate"], 4),
                  "voice_ttft_p50_ms_cached": cached["ttft_p50_ms"],
                  "voice_ttft_p50_ms_uncached": uncached["ttft_p50_ms"],
                  "voice_ttft_p50_ratio": round(cached["ttft_p50_ms"] / uncached["ttft_p50_ms"], 4)}


def run_prefix(args: argparse.Namespace) -> int:
    from homeai.bench.pulled_llm import pulled_llm_folder

    folder = pulled_llm_folder(args.model, quiet=args.json)
    if isinstance(folder, int):
        return folder

    def log(msg: str) -> None:  # with --json, progress goes to stderr so stdout stays one object
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    system_tokens, turns, uncached_turns, pairs = (200, 4, 2, 1) if args.quick else \
        (args.system_tokens, args.turns, args.uncached_turns, args.pairs)
    out = {"model": args.model} | run_prefix_bench(folder, system_tokens, turns, uncached_turns, pairs, log)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
    return 0
