"""A voice burst over HTTP: 40 simultaneous voice requests, where the default policy allows 8 running
and 16 queued, admit 24 and reject 16 with 429 (they got 21 x 429: free running slots were not counted
as room until the device thread had started requests into them). Its own server on the default policy.

No request can finish while the burst arrives (each asks for 200 tokens), so the count is exact however
the arrivals interleave with the engine's steps; a queued request may later time out (503), which is
not a rejection at admission and is not counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest
from server_launcher import running_server

from homeai.policy.loader import load_policy

pytestmark = pytest.mark.slow

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
NUM_REQUESTS = 40


async def burst(url: str) -> Counter[int]:
    body = {"model": "voice", "max_tokens": 200, "messages": [{"role": "user", "content": "Tell me a long story."}]}
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 limits=httpx.Limits(max_connections=NUM_REQUESTS)) as http:
        responses = await asyncio.gather(*(http.post("/v1/chat/completions", json=body)
                                           for _ in range(NUM_REQUESTS)))
    rejected = [r for r in responses if r.status_code == 429]
    assert all(0 < int(r.headers["retry-after"]) <= 10 for r in rejected)  # never more than voice's timeout
    return Counter(r.status_code for r in responses)


def test_40_voice_requests_admit_running_plus_queued(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                     tmp_path: Path) -> None:
    voice = load_policy(DEFAULT_POLICY).classes["voice"]
    assert (voice.max_running, voice.default_queue_policy.max_queue_size) == (8, 16)
    with running_server(tmp_path, homeai_cache_dir) as server:
        statuses = asyncio.run(burst(server.url))
    assert statuses[429] == NUM_REQUESTS - 24, statuses
    assert statuses[200] + statuses[503] == 24, statuses
