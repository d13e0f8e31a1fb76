"""Editing the running policy file on disk: a valid change applies, an invalid one is refused (the server
says so in its log) and the running policy stays."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess
from waiting import wait_until

pytestmark = pytest.mark.slow
VOICE_LIMIT = "priority: 0\n    max_output_tokens: 8"
REFUSED = "policy file change refused"  # homeai/api/policy_watcher.py logs this (an error) for each refusal


def voice_tokens(http: httpx.Client) -> int:
    body = {"model": "voice", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "ignore_eos": True}
    response = http.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def wait_for_tokens(http: httpx.Client, expected: int) -> None:
    wait_until(lambda: voice_tokens(http) == expected, interval_s=0.3,
               what=lambda: f"voice to answer {expected} tokens (it answers {voice_tokens(http)})")


def edit(path: Path, text: str) -> None:
    """Replace the file at once: the watcher never sees it half-written, so one edit is one change."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)


def refusals(server: ServerProcess) -> int:
    return server.log_path.read_text(errors="replace").count(REFUSED)


def test_policy_file_edits_hot_reload(policy_path: Path, http: httpx.Client, server: ServerProcess) -> None:
    original = policy_path.read_text()
    assert VOICE_LIMIT in original
    try:
        assert voice_tokens(http) == 8
        edit(policy_path, original.replace(VOICE_LIMIT, VOICE_LIMIT[:-1] + "2"))
        wait_for_tokens(http, 2)
        refused_before = refusals(server)
        edit(policy_path, original.replace("kind: llm", "kind: lmm", 1))  # invalid: refused
        wait_until(lambda: refusals(server) > refused_before, what="the server to refuse the invalid file")
        assert refusals(server) == refused_before + 1
        assert voice_tokens(http) == 2 and http.get("/v1/models").status_code == 200
    finally:
        edit(policy_path, original)
    wait_for_tokens(http, 8)
