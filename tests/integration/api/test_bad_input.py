"""Bad input and overload against a real server: the right status, the error shape of the API family,
and a client that leaves takes its KV blocks back with it."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from waiting import wait_until

from tests.integration.api.conftest import engine_state, wait_engine_idle

pytestmark = pytest.mark.slow
LLM = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}]
ENDLESS = {"model": LLM, "messages": QUESTION, "max_tokens": 1000, "ignore_eos": True}  # ~2 min on a CPU


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error  # type: ignore[no-any-return]


def test_malformed_json_and_wrong_types_name_the_problem(http: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    error = openai_error(http.post("/v1/chat/completions", content=b'{"model": "chat", "messages": [', headers=headers),
                         400)
    assert "malformed JSON" in error["message"]
    error = openai_error(http.post("/v1/chat/completions", json={"model": "chat", "messages": [
        {"role": "user", "content": 5}]}), 400)
    assert error["param"] == "messages[0].content" and "messages[0].content" in error["message"]
    error = openai_error(http.post("/v1/chat/completions", json={"model": "chat"}), 400)
    assert error["param"] == "messages"
    error = openai_error(http.post("/v1/chat/completions", json={"model": "chat", "messages": QUESTION,
                                                                 "temperature": 9}), 400)
    assert error["param"] == "temperature"
    error = openai_error(http.post("/v1/chat/completions", json={"model": "chat", "messages": QUESTION, "n": 2}), 400)
    assert error["param"] == "n"
    ollama = http.post("/api/chat", json={"model": 5, "messages": []})
    assert ollama.status_code == 400 and "model" in ollama.json()["error"]  # Ollama's {"error": "..."}


def test_what_openai_allows_is_served_and_what_we_cannot_honour_is_refused(http: httpx.Client) -> None:
    """``null`` where OpenAI's spec says "or null" is its default (it was a 400); a temperature of 1e-300 is
    greedy (dividing the logits by it made every token end-of-text); a logit bias, ``stream_options``
    without ``stream`` and ``echo`` with ``logprobs`` are 400s naming the field (the bias was dropped
    silently); ``echo`` of a token-id prompt puts the prompt's text first (it was left out)."""
    ask = {"model": LLM, "messages": QUESTION, "max_tokens": 4, "temperature": 0}
    greedy = http.post("/v1/chat/completions", json=ask).json()["choices"][0]["message"]["content"]
    for extra in ({"n": None, "stream": None}, {"temperature": 1e-300}):
        r = http.post("/v1/chat/completions", json={**ask, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == greedy
    r = http.post("/v1/responses", json={"model": LLM, "input": "hi", "max_output_tokens": 2, "stream": None})
    assert r.status_code == 200, r.text
    for extra, param in (({"logit_bias": {"19556": -100}}, "logit_bias"),
                         ({"stream_options": {"include_usage": True}}, "stream_options")):
        assert openai_error(http.post("/v1/chat/completions", json={**ask, **extra}), 400)["param"] == param
    assert http.post("/v1/chat/completions", json={**ask, "logit_bias": {}}).status_code == 200
    text = {"model": LLM, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    plain = http.post("/v1/completions", json=text).json()["choices"][0]["text"]
    ids = http.post("/v1/completions", json={**text, "prompt": [19556], "echo": True}).json()["choices"][0]["text"]
    assert ids == "Hello" + plain, ids  # token 19556 is "Hello"
    scored = http.post("/v1/completions", json={**text, "echo": True, "logprobs": 1})
    assert openai_error(scored, 400)["param"] == "echo"


def test_what_no_answer_could_honour_is_refused_naming_it(http: httpx.Client) -> None:
    """Each was served or dropped silently before: an empty text embedded (OpenAI refuses it; Ollama's
    /api/embed answers no vectors), a stored-item reference dropped from a Responses input, Ollama's
    ``suffix`` and ``template`` ignored; a header's class of the other kind named no field."""
    for body, param in (({"input": ""}, "input"), ({"input": ["a", ""]}, "input[1]")):
        error = openai_error(http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", **body}), 400)
        assert error["param"] == param and "empty" in error["message"]
    for empty in ("", []):
        r = http.post("/api/embed", json={"model": "all-minilm-l6-v2", "input": empty})
        assert r.status_code == 200 and r.json()["embeddings"] == [], r.text
    ref = {"model": LLM, "input": [{"type": "item_reference", "id": "msg_1"}, {"role": "user", "content": "hi"}]}
    assert openai_error(http.post("/v1/responses", json=ref), 400)["param"] == "input[0]"
    for field in ("suffix", "template"):
        r = http.post("/api/generate", json={"model": LLM, "prompt": "def f(", field: "x", "stream": False})
        assert r.status_code == 400 and field in r.json()["error"], r.text
    error = openai_error(http.post("/v1/chat/completions", json={"model": LLM, "messages": QUESTION},
                                   headers={"X-HomeAI-Class": "embedding"}), 400)
    assert error["param"] == "x-homeai-class" and "serves embedding" in error["message"]


def test_an_embedding_class_holds_its_inputs_to_its_max_prompt_tokens(http: httpx.Client) -> None:
    """The class's limit applied to LLM prompts only: an embedding class of 8 tokens embedded 20."""
    snippets = {"X-HomeAI-Class": "snippets"}
    words = "one two three four five six seven eight nine ten eleven twelve"
    error = openai_error(http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": words},
                                   headers=snippets), 400)
    assert error["param"] == "input" and "class 'snippets' embeds at most 8 tokens" in error["message"]
    r = http.post("/api/embed", json={"model": "all-minilm-l6-v2", "input": words}, headers=snippets)
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == 8  # Ollama's truncate (default): cut
    r = http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": words})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 8  # the embedding class: 256


def test_prompt_longer_than_the_context(http: httpx.Client) -> None:
    long = [{"role": "user", "content": "hello " * 2100}]
    error = openai_error(http.post("/v1/chat/completions", json={"model": LLM, "messages": long}), 400)
    assert "tokens" in error["message"] and "2048" in error["message"] and error["param"] == "messages"
    ollama = http.post("/api/generate", json={"model": LLM, "prompt": "hello " * 2100})
    assert ollama.status_code == 400 and "2048" in ollama.json()["error"]


def test_unknown_model_and_route(http: httpx.Client) -> None:
    error = openai_error(http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": QUESTION}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    openai_error(http.get("/v1/nowhere"), 404)


def test_body_too_large(http: httpx.Client) -> None:
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "' + b"a" * (11 * 2**20) + b'"}]}'
    response = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    openai_error(response, 413)


def long_requests(http: httpx.Client) -> dict[str, int]:
    """The ``long`` class's finished requests by status, from /v1/stats."""
    return dict(http.get("/v1/stats").json()["classes"]["long"].get("requests", {}))


def assert_aborted_early(http: httpx.Client, aborted_before: int) -> None:
    """The engine is idle with every KV block free, and the one request the test left was metered as
    aborted well short of its 1,000 tokens: ended by the client's leaving, not by finishing."""
    wait_engine_idle(http)
    wait_until(lambda: long_requests(http).get("aborted", 0) > aborted_before, what="the abort to be metered")
    assert long_requests(http).get("aborted", 0) == aborted_before + 1
    last = next(r for r in http.get("/v1/stats").json()["recent"] if r["class_name"] == "long")
    assert last["status"] == "aborted" and last["num_output_tokens"] < ENDLESS["max_tokens"], last


def test_full_queue_429_and_queue_timeout_503(http: httpx.Client) -> None:
    """Class "solo" runs one sequence and queues one: the third request is refused at once (429); the
    queued one times out after 1.5 s (503). Both say when to retry."""
    solo = {"X-HomeAI-Class": "solo"}
    queued: dict[str, httpx.Response] = {}
    with http.stream("POST", "/v1/chat/completions", json={**ENDLESS, "stream": True}, headers=solo) as running:
        assert running.status_code == 200
        lines = running.iter_lines()  # keep it: a dropped line iterator closes the connection
        next(lines)  # the first token is out: it runs
        waiter = threading.Thread(target=lambda: queued.update(r=http.post(
            "/v1/chat/completions", json={"model": LLM, "messages": QUESTION, "max_tokens": 2}, headers=solo)))
        waiter.start()
        wait_until(lambda: engine_state(http)[1]["solo"]["queued"] == 1, what="the second request to queue")
        rejected = http.post("/v1/chat/completions", json={"model": LLM, "messages": QUESTION, "max_tokens": 2},
                             headers=solo)
        error = openai_error(rejected, 429)
        assert error["code"] == "queue_full" and int(rejected.headers["retry-after"]) >= 1
        ollama = http.post("/api/chat", json={"model": LLM, "messages": QUESTION}, headers=solo)
        assert ollama.status_code == 429 and "full" in ollama.json()["error"] and "retry-after" in ollama.headers
        waiter.join(timeout=30)
        assert next(lines) is not None  # still streaming
    error = openai_error(queued["r"], 503)
    assert error["code"] == "queue_timeout" and int(queued["r"].headers["retry-after"]) >= 1
    wait_engine_idle(http)


def test_streaming_disconnect_aborts_and_frees_kv(http: httpx.Client) -> None:
    """Leave a long stream after a few tokens: it is aborted (not run to its end, minutes away) and every
    KV block is free. Meanwhile the server keeps answering: the loop never waits on the device."""
    wait_engine_idle(http)
    aborted_before = long_requests(http).get("aborted", 0)
    long = {"X-HomeAI-Class": "long"}
    with http.stream("POST", "/v1/chat/completions", json={**ENDLESS, "stream": True}, headers=long) as response:
        lines = response.iter_lines()
        for _ in range(4):
            next(lines)
        # /v1/stats is published up to SNAPSHOT_EVERY_S behind the device: the first tokens can come sooner
        wait_until(lambda: (state := engine_state(http))[0] > 0 and state[1]["long"]["running"] == 1,
                   what="the open stream's KV blocks and running slot in /v1/stats")
        assert http.get("/api/version").status_code == 200
        assert engine_state(http)[1]["long"]["running"] == 1  # answered while the generation runs on
        assert next(lines) is not None
    assert_aborted_early(http, aborted_before)


def test_non_streaming_disconnect_aborts_and_frees_kv(http: httpx.Client, server_url: str) -> None:
    wait_engine_idle(http)
    aborted_before = long_requests(http).get("aborted", 0)
    with httpx.Client(base_url=server_url, timeout=httpx.Timeout(30, read=2.0)) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/chat/completions", json=ENDLESS, headers={"X-HomeAI-Class": "long"})
    assert_aborted_early(http, aborted_before)
