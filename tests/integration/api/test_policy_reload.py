"""Editing the running policy file on disk: a valid change applies within seconds, an invalid one is
refused and the running policy stays."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow
VOICE_LIMIT = "priority: 0\n    max_output_tokens: 8"


def voice_tokens(http: httpx.Client) -> int:
    body = {"model": "voice", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "ignore_eos": True}
    response = http.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def wait_for_tokens(http: httpx.Client, expected: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := voice_tokens(http)) != expected:
        assert time.monotonic() < deadline, f"voice still answers {got} tokens, expected {expected}"
        time.sleep(0.3)


def test_policy_file_edits_hot_reload(policy_path: Path, http: httpx.Client) -> None:
    original = policy_path.read_text()
    assert VOICE_LIMIT in original
    try:
        assert voice_tokens(http) == 8
        policy_path.write_text(original.replace(VOICE_LIMIT, VOICE_LIMIT[:-1] + "2"))
        wait_for_tokens(http, 2)
        policy_path.write_text(original.replace("kind: llm", "kind: lmm", 1))  # invalid: refused
        time.sleep(2.5)
        assert voice_tokens(http) == 2 and http.get("/v1/models").status_code == 200
    finally:
        policy_path.write_text(original)
    wait_for_tokens(http, 8)
