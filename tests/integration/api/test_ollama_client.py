"""The official `ollama` package against a real server, as Home Assistant and Open WebUI use it."""

from __future__ import annotations

import httpx
import pytest
from ollama import Client, ResponseError

pytestmark = pytest.mark.slow
LLM, EMBEDDING = "smollm2-135m-instruct", "all-minilm-l6-v2"
# The answer's first token is a near tie in float32 itself ("The" -1.88 against "L" -1.97 for the bare
# question): "Answer in one sentence." leaves every token of the greedy answer 0.86 nats or more ahead, so
# int4's rounding and a cached prompt's other kernels give the same answer.
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
GREEDY = {"temperature": 0, "num_predict": 8}
# What Home Assistant's Ollama integration sends when it exposes the house to the model.
HA_TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device or entity",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]


@pytest.fixture(scope="module")
def client(server_url: str) -> Client:
    return Client(host=server_url, timeout=60)


def test_version_tags_ps_show(client: Client, http: httpx.Client) -> None:
    assert http.get("/api/version").json()["version"]  # the package has no call for it
    assert http.get("/").text == "Ollama is running"
    names = {m.model for m in client.list().models}
    assert {f"{LLM}:latest", f"{EMBEDDING}:latest", "voice:latest"} <= names
    loaded = {m.model for m in client.ps().models}
    assert {f"{LLM}:latest", f"{EMBEDDING}:latest"} <= loaded
    shown = client.show(LLM)
    assert "completion" in shown.capabilities and shown.details.family == "llama" and "im_start" in shown.template
    assert client.show(EMBEDDING).capabilities == ["embedding"]


def test_pull_reports_success(client: Client) -> None:
    statuses = [p.status for p in client.pull(f"{LLM}:latest", stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert client.pull(LLM).status == "success"
    with pytest.raises(ResponseError) as err:
        client.pull("no-such-model")
    assert err.value.status_code == 404


def test_chat_streaming_and_not(client: Client) -> None:
    whole = client.chat(model=f"{LLM}:latest", messages=QUESTION, options=GREEDY, keep_alive="5m")
    assert "Paris" in whole.message.content and whole.done and whole.done_reason in ("stop", "length")
    assert 1 <= whole.eval_count <= 8 and whole.prompt_eval_count > 5
    parts = list(client.chat(model=LLM, messages=QUESTION, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])


def test_chat_with_tools_answers_in_plain_text(client: Client) -> None:
    messages = [{"role": "system", "content": "You control a home."},
                {"role": "user", "content": "Turn on the kitchen light"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "HassTurnOn", "arguments": {"name": "kitchen light"}}}]},
                {"role": "tool", "content": '{"success": true}'}]
    for stream in (False, True):
        answer = client.chat(model="voice", messages=messages, tools=HA_TOOLS, options=GREEDY, stream=stream)
        last = list(answer)[-1] if stream else answer
        assert last.done and not last.message.tool_calls


def test_generate(client: Client) -> None:
    whole = client.generate(model=LLM, prompt=QUESTION[0]["content"], options=GREEDY)
    assert "Paris" in whole.response and whole.done
    # The conversation's token ids, which a client sends back to go on (it was never returned)
    assert whole.context and len(whole.context) == whole.prompt_eval_count + whole.eval_count
    parts = list(client.generate(model=LLM, prompt="And of Italy?", context=whole.context, options=GREEDY,
                                 stream=True))
    assert parts[-1].context and parts[-1].context[:len(whole.context)] == whole.context
    assert parts[-1].prompt_eval_count > len(whole.context)
    raw = list(client.generate(model=LLM, prompt="The capital of France is", raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in raw).strip() and raw[-1].context is None  # as Ollama: none when raw
    assert client.generate(model=LLM).done_reason == "load"  # no prompt: "load the model"


def test_embed(client: Client) -> None:
    many = client.embed(model=EMBEDDING, input=["hello", "world"])
    assert len(many.embeddings) == 2 and len(many.embeddings[0]) == 384
    legacy = client.embeddings(model=EMBEDDING, prompt="hello")
    assert legacy.embedding == pytest.approx(many.embeddings[0], abs=1e-6)


def test_errors_have_ollama_shape(client: Client) -> None:
    with pytest.raises(ResponseError) as err:
        client.chat(model="no-such-model", messages=QUESTION)
    assert err.value.status_code == 404 and "no-such-model" in err.value.error
    with pytest.raises(ResponseError) as err:
        client.embed(model=LLM, input="x")
    assert err.value.status_code == 400
