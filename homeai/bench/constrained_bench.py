"""What grammar-constrained decoding costs: 16 streams with a JSON-schema constraint on every stream
against the same 16 streams unconstrained, alternated in one run (a shared machine drifts between runs).

The schema (an array of at least 10 000 integers) cannot be complete before ``max_tokens``, so both runs
make exactly the same number of tokens and neither stops early. Reported: ``constrained_overhead_c16``
= decode tokens/s constrained / unconstrained (best of ``rounds`` each; goal >= 0.9).
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
    """Aggregate decode rate: each stream's (tokens - 1) / (last - first token time), summed."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=constraint is None,
                            constraint=constraint)

    async def one(ids: list[int]) -> float:
        first = last = 0.0
        got = 0
        async for delta in engine.generate(ids, params):
            now = time.perf_counter()
            if delta.token_ids and not got:
                first = now
            got, last = delta.num_output_tokens, now
        return (got - 1) / (last - first) if got > 1 and last > first else 0.0

    return sum(await asyncio.gather(*(one(p) for p in prompts)))


def constrained_overhead(engine: Any, prompts: list[list[int]], max_tokens: int, rounds: int = 2,
                         log: Any = print) -> dict[str, Any]:
    """Run both kinds ``rounds`` times, alternating; the started ``engine`` serves them."""
    prompts = prompts[:STREAMS]
    assert len(prompts) == STREAMS, f"needs {STREAMS} prompts"
    asyncio.run(decode_tok_s(engine, prompts[:2], 4, LONG_ARRAY))  # compile and warm up
    free: list[float] = []
    constrained: list[float] = []
    for _ in range(rounds):
        free.append(asyncio.run(decode_tok_s(engine, prompts, max_tokens, None)))
        constrained.append(asyncio.run(decode_tok_s(engine, prompts, max_tokens, LONG_ARRAY)))
    ratio = max(constrained) / max(free)
    log(f"constrained decoding, {STREAMS} streams x {max_tokens} tokens: {max(constrained):.1f} tok/s with a "
        f"JSON schema on every stream, {max(free):.1f} without: x{ratio:.2f}")
    return {"constrained_overhead_c16": ratio,
            "constrained": {"streams": STREAMS, "max_tokens": max_tokens, "rounds": rounds,
                            "unconstrained_decode_tok_s": free, "constrained_decode_tok_s": constrained}}
