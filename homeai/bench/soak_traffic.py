"""The soak's clients: every workload class at once, over HTTP only, until ``stop`` is set.

Each client loops on one kind of request and tallies what it saw (``ok``, ``dropped`` for a stream
it closed on purpose mid-way, ``429``, other statuses, ``transport`` for a connection that failed).
Streams are read as a client reads them (SSE lines, NDJSON lines); a dropped stream is closed after
a couple of lines, which the server must notice, abort and meter. A storm fires a burst of requests
at the one-slot ``storm`` class, so most of them get 429.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from homeai.bench.soak_policy import ENCODER, LLM, SEARCH_USER, STORM_CLASS

COLLECTION = "soak"
WORDS = ("kitchen garden bicycle invoice dentist holiday recipe balcony plants kettle window train "
         "letter school football piano winter summer coffee neighbour").split()


@dataclass
class Tally:
    """Per client kind, how each request ended (as the client saw it)."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, kind: str, outcome: str) -> None:
        self.counts.setdefault(kind, Counter())[outcome] += 1

    def total(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {kind: dict(sorted(c.items())) for kind, c in sorted(self.counts.items())}


def sentence(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Traffic:
    """Starts the clients; ``run`` returns once ``stop`` is set and every client has finished."""

    def __init__(self, client: httpx.AsyncClient, stop: asyncio.Event, seed: int = 0) -> None:
        self.client, self.stop, self.tally = client, stop, Tally()
        self.rng = random.Random(seed)

    async def run(self) -> None:
        clients = [self._loop("voice", self.voice, 0.2), self._loop("voice", self.voice, 0.3),
                   self._loop("chat", self.chat, 0.2), self._loop("chat", self.chat, 0.4),
                   self._loop("ollama", self.ollama, 0.3), self._loop("responses", self.responses, 0.5),
                   self._loop("embedding", self.embeddings, 0.2), self._loop("search", self.search, 0.5),
                   self._loop("storm", self.storm, 10.0)]
        await asyncio.gather(*clients)

    async def _loop(self, kind: str, one: Any, pause_s: float) -> None:
        while not self.stop.is_set():
            try:
                outcome = await one()
            except httpx.HTTPError as exc:
                outcome = f"transport:{type(exc).__name__}"
            self.tally.add(kind, outcome)
            try:
                await asyncio.wait_for(self.stop.wait(), pause_s * (0.5 + self.rng.random()))
            except TimeoutError:
                pass

    # ---- one request of each kind ----------------------------------------------------------------
    async def voice(self) -> str:
        body = {"model": "voice", "messages": [{"role": "user", "content": sentence(self.rng, 4)}], "stream": True}
        return await self._stream("/v1/chat/completions", body, {"X-HomeAI-User": "kids"}, drop_after=None)

    async def chat(self) -> str:
        body = {"model": LLM, "messages": [{"role": "user", "content": sentence(self.rng, 20)}], "stream": True}
        drop = 2 if self.rng.random() < 0.3 else None
        return await self._stream("/v1/chat/completions", body, self._user(), drop_after=drop)

    async def ollama(self) -> str:
        body = {"model": LLM, "messages": [{"role": "user", "content": sentence(self.rng, 12)}],
                "options": {"num_predict": 12}}
        drop = 1 if self.rng.random() < 0.3 else None
        return await self._stream("/api/chat", body, self._user(), drop_after=drop)

    async def responses(self) -> str:
        body = {"model": LLM, "input": sentence(self.rng, 10), "max_output_tokens": 8}
        r = await self.client.post("/v1/responses", json=body, headers=self._user())
        return _status(r)

    async def embeddings(self) -> str:
        texts = [sentence(self.rng, 6) for _ in range(self.rng.randint(1, 6))]
        if self.rng.random() < 0.5:
            r = await self.client.post("/v1/embeddings", json={"model": ENCODER, "input": texts}, headers=self._user())
        else:
            r = await self.client.post("/api/embed", json={"model": ENCODER, "input": texts}, headers=self._user())
        return _status(r)

    async def search(self) -> str:
        body = {"collection": COLLECTION, "query": sentence(self.rng, 5), "k": 3}
        r = await self.client.post("/v1/search", json=body, headers={"X-HomeAI-User": SEARCH_USER})
        return _status(r)

    async def storm(self) -> str:
        """A burst of 24 requests at a class that runs one and queues two or three: a 429 storm."""
        body = {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"X-HomeAI-Class": STORM_CLASS, "X-HomeAI-User": "stormy"}
        results = await asyncio.gather(*(self.client.post("/v1/chat/completions", json=body, headers=headers)
                                         for _ in range(24)), return_exceptions=True)
        for r in results[1:]:
            self.tally.add("storm", _status(r) if isinstance(r, httpx.Response) else f"transport:{type(r).__name__}")
        first = results[0]
        return _status(first) if isinstance(first, httpx.Response) else f"transport:{type(first).__name__}"

    # ---- helpers ---------------------------------------------------------------------------------
    def _user(self) -> dict[str, str]:
        return {"X-HomeAI-User": self.rng.choice(("alice", "bob", "carol"))}

    async def _stream(self, path: str, body: dict[str, Any], headers: dict[str, str], drop_after: int | None) -> str:
        """Read a streamed answer to its end, or close it after ``drop_after`` lines (a client gone)."""
        async with self.client.stream("POST", path, json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return _status(r)
            lines = 0
            async for line in r.aiter_lines():
                if line.strip():
                    lines += 1
                if drop_after is not None and lines >= drop_after:
                    return "dropped"
        return "ok"


def _status(r: httpx.Response) -> str:
    return "ok" if r.status_code == 200 else str(r.status_code)
