"""Input limits against the real server: deep JSON and over-long embedding inputs.

Before the fixes: JSON nested 1,000 deep answered 500 "internal error: RecursionError" with a traceback
in the log; an embedding input over the model's 256 tokens was cut without notice on every route.
"""

from __future__ import annotations

import httpx
import pytest
from server_launcher import ServerProcess

pytestmark = pytest.mark.slow

EMBEDDER = "all-minilm-l6-v2"  # embeds at most 256 tokens per input
LONG = "lighthouse " * 400  # ~400 tokens
SHORT = "a lighthouse by the sea"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings", "/api/chat", "/api/embed",
                                  "/v1/responses", "/admin/policy/rollback", "/v1/jobs"])
def test_json_nested_1000_deep_is_a_400(http: httpx.Client, server: ServerProcess, path: str) -> None:
    deep = b'{"model": "m", "input": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    r = http.post(path, content=deep, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested more than" in r.text
    assert "RecursionError" not in server.log()


def test_openai_embeddings_refuse_an_input_over_the_limit(http: httpx.Client) -> None:
    r = http.post("/v1/embeddings", json={"model": EMBEDDER, "input": LONG})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input" and "256" in error["message"]
    r = http.post("/v1/embeddings", json={"model": EMBEDDER, "input": [SHORT, LONG]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]"
    assert http.post("/v1/embeddings", json={"model": EMBEDDER, "input": SHORT}).status_code == 200


def test_ollama_embed_follows_truncate(http: httpx.Client) -> None:
    cut = http.post("/api/embed", json={"model": EMBEDDER, "input": [LONG]})  # truncate defaults to true
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 256
    r = http.post("/api/embed", json={"model": EMBEDDER, "input": [SHORT, LONG], "truncate": False})
    assert r.status_code == 400 and "input[1]" in r.json()["error"]
    ok = http.post("/api/embed", json={"model": EMBEDDER, "input": SHORT, "truncate": False})
    assert ok.status_code == 200 and len(ok.json()["embeddings"]) == 1
