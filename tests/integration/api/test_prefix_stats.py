"""A real server reuses a repeated system prompt from its prefix cache and says so: the class's hit
counters grow in /v1/stats and /metrics."""

from __future__ import annotations

import httpx
import pytest
from waiting import wait_until

pytestmark = pytest.mark.slow
SYSTEM = ("You are a voice assistant for a smart home. Keep answers short. The devices are: "
          + ", ".join(f"light {i} in room {i % 7}" for i in range(40)) + ".")


def voice_prefix(http: httpx.Client) -> dict[str, int]:
    body = http.get("/v1/stats").raise_for_status().json()
    return body["classes"]["voice"]["prefix_cache"]


def test_a_repeated_system_prompt_is_served_from_the_cache(http: httpx.Client) -> None:
    before = voice_prefix(http)
    for turn in ("turn on light 3", "is light 12 on?"):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": turn}]
        http.post("/v1/chat/completions", json={"model": "voice", "messages": messages, "max_tokens": 2,
                                                "temperature": 0}).raise_for_status()
    # the device thread publishes its view a moment after a step: wait for both requests to show
    wait_until(lambda: voice_prefix(http)["requests"] - before["requests"] >= 2, what="both requests in the stats")
    after = voice_prefix(http)
    assert after["requests"] - before["requests"] == 2
    assert after["hit_requests"] - before["hit_requests"] >= 1
    assert after["hit_tokens"] - before["hit_tokens"] >= 200  # the system prompt is ~400 tokens
    assert 0 < after["token_hit_rate"] <= 1
    metrics = http.get("/metrics").raise_for_status().text
    assert 'homeai_prefix_cache_hit_tokens_total{class_name="voice"}' in metrics
    assert 'homeai_prefix_cache_hit_ratio{class_name="voice",unit="requests"}' in metrics
