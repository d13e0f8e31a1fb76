"""Synthetic household workloads: who sends what, when (deterministic for a seed)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(slots=True)
class TraceRequest:
    arrival_s: float
    class_name: str  # the class under our policy; baselines map it onto their own queues
    kind: str  # llm | embedding
    user: str
    prompt_tokens: int = 0  # llm
    max_tokens: int = 0  # llm
    input_tokens: list[int] | None = None  # embedding: tokens of each input

    @property
    def background(self) -> bool:
        return self.class_name in ("indexing", "summarize")


def _poisson(rng: random.Random, rate_per_s: float, horizon_s: float, start_s: float = 0.0) -> list[float]:
    t, out = start_s, []
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= horizon_s:
            return out
        out.append(t)


def household(horizon_s: float = 120.0, seed: int = 0, background: bool = True,
              index_chunks: int = 200000, summaries: int = 400) -> list[TraceRequest]:
    """Voice every ~2 s (short prompt, up to 32 tokens); two chat users, one sending 8x the other's
    load (medium prompts, 128 tokens); search queries; and, with ``background``, a flood of document
    chunks to embed plus long-document summaries, all queued at the start as an overnight job does."""
    rng = random.Random(seed)
    reqs: list[TraceRequest] = []
    for t in _poisson(rng, 0.5, horizon_s):
        reqs.append(TraceRequest(t, "voice", "llm", "kitchen", rng.randint(20, 60), rng.randint(8, 32)))
    for user, rate in (("dad", 2.0), ("teen", 0.25)):
        for t in _poisson(rng, rate, horizon_s):
            reqs.append(TraceRequest(t, "chat", "llm", user, rng.randint(150, 400), 128))
    for t in _poisson(rng, 1.0, horizon_s):
        reqs.append(TraceRequest(t, "embedding", "embedding", "search", input_tokens=[rng.randint(8, 24)]))
    if background:
        per_request = 32
        for _ in range(index_chunks // per_request):
            reqs.append(TraceRequest(0.0, "indexing", "embedding", "indexer",
                                     input_tokens=[rng.randint(128, 256) for _ in range(per_request)]))
        for _ in range(summaries):
            reqs.append(TraceRequest(0.0, "summarize", "llm", "indexer", rng.randint(1000, 1700), 128))
    reqs.sort(key=lambda r: r.arrival_s)
    return reqs


TRACES = {"household": household}
