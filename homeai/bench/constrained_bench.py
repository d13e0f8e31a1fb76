"""What grammar-constrained decoding costs: 16 streams with a JSON-schema constraint on every stream
against the same 16 streams unconstrained, alternated in one run (a shared machine drifts between runs).

The schema (an array of at least 10 000 integers) cannot be complete before ``max_tokens``, so both runs
make exactly the same number of tokens and neither stops early. Reported: ``constrained_overhead_c16``
= decode tokens/s constrained / unconstrained, each counted while all 16 streams decode (best of
``rounds`` each; goal >= 0.9).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from homeai.core.types import Constraint, ConstraintKind, SamplingParams

STREAMS = 16
LONG_ARRAY = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps({"type": "array", "items": {"type": "integer"},
                                                                 "minItems": 10_000}))


async def decode_tok_s(engine: Any, prompts: list[list[int]], max_tokens: int, constraint: Constraint | None) -> float:
    """Decode tokens/s while every stream decodes: from the moment the last stream got its first token
    to the moment the first one finished (before and after, the batch is smaller and steps are cheaper)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=constraint is None,
                            constraint=constraint)

    async def one(ids: list[int]) -> list[tuple[float, int]]:
        marks: list[tuple[float, int]] = []  # (time, tokens so far)
        async for delta in engine.generate(ids, params):
            if delta.token_ids:
                marks.append((time.perf_counter(), delta.num_output_tokens))
        return marks

    streams = await asyncio.gather(*(one(p) for p in prompts))
    start, end = max(m[0][0] for m in streams), min(m[-1][0] for m in streams)
    if end <= start:
        return 0.0

    def tokens_at(marks: list[tuple[float, int]], t: float) -> int:
        return max((n for at, n in marks if at <= t), default=0)

    return sum(tokens_at(m, end) - tokens_at(m, start) for m in streams) / (end - start)


def constrained_overhead(engine: Any, prompts: list[list[int]], max_tokens: int, rounds: int = 2,
                         log: Any = print) -> dict[str, Any]:
    """Run both kinds ``rounds`` times, alternating; the started ``engine`` serves them."""
    prompts = prompts[:STREAMS]
    assert len(prompts) == STREAMS, f"needs {STREAMS} prompts"
    assert max_tokens >= 16, "too few tokens for a window in which every stream decodes"
    asyncio.run(decode_tok_s(engine, prompts[:2], 4, LONG_ARRAY))  # compile and warm up
    free: list[float] = []
    constrained: list[float] = []
    for _ in range(rounds):
        free.append(asyncio.run(decode_tok_s(engine, prompts, max_tokens, None)))
        constrained.append(asyncio.run(decode_tok_s(engine, prompts, max_tokens, LONG_ARRAY)))
    if min(max(free), max(constrained)) <= 0:
        raise RuntimeError(f"the {STREAMS} streams never decoded together: the engine needs max_num_seqs >= "
                           f"{STREAMS} and KV cache for all of them")
    ratio = max(constrained) / max(free)
    log(f"constrained decoding, {STREAMS} streams x {max_tokens} tokens: {max(constrained):.1f} tok/s with a "
        f"JSON schema on every stream, {max(free):.1f} without: x{ratio:.2f}")
    return {"constrained_overhead_c16": ratio,
            "constrained": {"streams": STREAMS, "max_tokens": max_tokens, "rounds": rounds,
                            "unconstrained_decode_tok_s": free, "constrained_decode_tok_s": constrained}}
