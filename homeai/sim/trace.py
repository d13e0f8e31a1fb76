"""Synthetic household workloads: who sends what, when (deterministic for a seed).

Every trace takes ``background``: without it, the same interactive requests arrive alone, which is the
"idle" run the bench compares voice's figures against. Background work is queued by closed-loop jobs
(the simulator keeps a few requests of each background class outstanding) from its arrival time on.
"""

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
    t, out = start_s, list[float]()
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


def _interactive(rng: random.Random, horizon_s: float, start_s: float = 0.0, chat: bool = True,
                 search_rate: float = 1.0) -> list[TraceRequest]:
    """The household's interactive part from ``start_s``: voice every ~2 s, two chat users, searches."""
    reqs = [TraceRequest(t, "voice", "llm", "kitchen", rng.randint(20, 60), rng.randint(8, 32))
            for t in _poisson(rng, 0.5, horizon_s, start_s)]
    if chat:
        for user, rate in (("dad", 2.0), ("teen", 0.25)):
            reqs += [TraceRequest(t, "chat", "llm", user, rng.randint(150, 400), 128)
                     for t in _poisson(rng, rate, horizon_s, start_s)]
    reqs += [TraceRequest(t, "embedding", "embedding", "search", input_tokens=[rng.randint(8, 24)])
             for t in _poisson(rng, search_rate, horizon_s, start_s)]
    return reqs


def _index_job(rng: random.Random, start_s: float, chunks: int = 200000) -> list[TraceRequest]:
    return [TraceRequest(start_s, "indexing", "embedding", "indexer",
                         input_tokens=[rng.randint(128, 256) for _ in range(32)]) for _ in range(chunks // 32)]


def _summaries(rng: random.Random, start_s: float, count: int = 400) -> list[TraceRequest]:
    return [TraceRequest(start_s, "summarize", "llm", "indexer", rng.randint(1000, 1700), 128)
            for _ in range(count)]


def cold_background(horizon_s: float = 120.0, seed: int = 0, background: bool = True) -> list[TraceRequest]:
    """An idle server takes an overnight job (summaries and chunks to embed) at t=0; the household
    wakes up 5 s later. What background was admitted at a cold start must not lock voice out: an idle
    device is not starvation for the background to be repaid."""
    rng = random.Random(seed)
    reqs = _interactive(rng, horizon_s, start_s=5.0)
    if background:
        reqs += _index_job(rng, 0.0) + _summaries(rng, 0.0)
    return sorted(reqs, key=lambda r: r.arrival_s)


def index_start(horizon_s: float = 120.0, seed: int = 0, background: bool = True) -> list[TraceRequest]:
    """The household is busy from t=0; an indexing job starts at t=10 s. Its min_share is a rate
    from then on, not a debt for the first 10 s repaid in back-to-back batches that would stall voice."""
    rng = random.Random(seed)
    reqs = _interactive(rng, horizon_s)
    if background:
        reqs += _index_job(rng, min(10.0, horizon_s / 2))
    return sorted(reqs, key=lambda r: r.arrival_s)


def long_chat_prompts(horizon_s: float = 120.0, seed: int = 0, background: bool = True) -> list[TraceRequest]:
    """A 6000-token chat prompt every 2 s (a document pasted into chat) beside voice, searches and the
    overnight job. Steps sized by the targets keep voice's TTFT and ITL within them: an unsplit long
    prompt would make every step carrying voice as long as the whole prompt."""
    rng = random.Random(seed)
    reqs = _interactive(rng, horizon_s, chat=False)
    t = 1.0
    while t < horizon_s:
        reqs.append(TraceRequest(t, "chat", "llm", "dad", 6000, 64))
        t += 2.0
    if background:
        reqs += _index_job(rng, 0.0) + _summaries(rng, 0.0)
    return sorted(reqs, key=lambda r: r.arrival_s)


def search_during_background_window(horizon_s: float = 120.0, seed: int = 0,
                                    background: bool = True) -> list[TraceRequest]:
    """Summaries trickle in one at a time (each opens summarize's 50 ms delay window) while searches
    arrive often. A background class whose window is still closed has nothing to run yet: it must
    neither hold back a ready search batch nor make the device spin on empty steps."""
    rng = random.Random(seed)
    reqs = _interactive(rng, horizon_s, search_rate=4.0)
    if background:
        reqs += [TraceRequest(t, "summarize", "llm", "indexer", rng.randint(200, 600), 32)
                 for t in _poisson(rng, 1.0, horizon_s)]
    return sorted(reqs, key=lambda r: r.arrival_s)


def _every(period_s: float, start_s: float, horizon_s: float) -> list[float]:
    return [start_s + period_s * k for k in range(int((horizon_s - start_s) / period_s) + 1)
            if start_s + period_s * k < horizon_s]


REAL_SUMMARIES_IN_FLIGHT = 12  # `homeai bench serve`'s household: summary clients, each sending the next


def household_real(horizon_s: float = 120.0, seed: int = 0, background: bool = True) -> list[TraceRequest]:
    """The household as `homeai bench serve` sends it to the real server (``serve_bench``): voice every
    2 s from 0.5 s (40-token prompt, 32 tokens), chat every 5 s from 1 s (100-token prompt, 128 tokens),
    and with ``background`` 12 summaries of 1,500-token documents (256 tokens) kept in flight (the
    simulator's closed loop keeps ``REAL_SUMMARIES_IN_FLIGHT`` outstanding); every output runs to its
    max_tokens. No searches and no indexing. Deterministic: ``seed`` is unused. Meant for the server's
    default KV pool for float32 weights (364 blocks) and the cpu-135m profile (``TRACE_SETTINGS``)."""
    del seed
    reqs = [TraceRequest(t, "voice", "llm", "kitchen", 40, 32) for t in _every(2.0, 0.5, horizon_s)]
    reqs += [TraceRequest(t, "chat", "llm", "phone", 100, 128) for t in _every(5.0, 1.0, horizon_s)]
    if background:  # enough for the closed loop never to run dry within the horizon
        reqs += [TraceRequest(0.0, "summarize", "llm", "indexer", 1500, 256)
                 for _ in range(REAL_SUMMARIES_IN_FLIGHT + int(horizon_s))]
    return sorted(reqs, key=lambda r: r.arrival_s)


def household_two_models(horizon_s: float = 120.0, seed: int = 0, background: bool = True) -> list[TraceRequest]:
    """The household (``household``) on two LLMs: voice on a small fast model, chat and the summaries on a
    large one (``TRACE_SETTINGS`` moves the policy's classes onto them, each model with its own costs and
    KV pool); searches and indexing on the encoder as before."""
    return household(horizon_s, seed, background)


@dataclass(slots=True, frozen=True)
class TraceSettings:
    """How a trace is run when it names its own setting: the KV pool, the background requests kept in
    flight (the simulator's closed loop), the cost profile it speaks for (None: the caller's), and the
    LLMs its classes run on: (class or "*" for the other LLM classes, model, cost profile), first match."""

    kv_blocks: int | None = None
    background_in_flight: int = 16
    profile: str | None = None
    models: tuple[tuple[str, str, str], ...] = ()


def _household(horizon_s: float = 120.0, seed: int = 0, background: bool = True) -> list[TraceRequest]:
    return household(horizon_s, seed, background)


TRACES = {"household": _household, "cold-background": cold_background, "index-start": index_start,
          "long-chat-prompts": long_chat_prompts, "search-during-background-window": search_during_background_window,
          "household-real": household_real, "household-two-models": household_two_models}
# household-real is the server's household at its defaults: 364 KV blocks (kv_cache_mb 256, SmolLM2-135M
# with a float32 cache; the int4 default's float16 cache holds 728, less pressure), 12 summaries in flight,
# SmolLM2-135M's costs on a 2-core CPU.
TRACE_SETTINGS = {"household-real": TraceSettings(kv_blocks=364, background_in_flight=REAL_SUMMARIES_IN_FLIGHT,
                                                  profile="cpu-135m"),
                  # voice on a 1B model, chat and the summaries on an 8B one, both on one 24 GB card
                  "household-two-models": TraceSettings(models=(("voice", "voice-1b", "gpu-1b"),
                                                                ("*", "chat-8b", "gpu-8b")))}


def households(num_houses: int, horizon_s: float = 120.0, seed: int = 0,
               background: bool = True) -> list[TraceRequest]:
    """``num_houses`` independent households (``household`` with seeds ``seed``, ``seed + 1``, ...), merged:
    each house's users are its own (``kitchen@h1``), and each brings its own overnight job, so the
    background work grows with the houses as the interactive traffic does."""
    reqs: list[TraceRequest] = []
    for house in range(num_houses):
        for req in household(horizon_s, seed + house, background):
            req.user = f"{req.user}@h{house}"
            reqs.append(req)
    reqs.sort(key=lambda r: r.arrival_s)
    return reqs
