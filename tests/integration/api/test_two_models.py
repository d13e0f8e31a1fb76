"""Two LLMs on one device through the HTTP server: voice on a float32 entry of the SmolLM2 GGUF (pinned),
chat on the packaged entry (int4 on the CPU: the same Q4_1 groups), each with its own KV cache and class
scheduler under the one batcher. Its own server on a model repository of its own (tmp): the second entry
reads the already pulled folder in place, so nothing is downloaded.

Both answer; Ollama's ``keep_alive: 0`` takes the chat model off the device (/api/ps, the server's RSS)
and the next chat request loads it again; voice's median time to first token under a chat flood on the
other model stays within 1.5x of its median without it, measured side by side in the same run (a ratio, as
the acceptance of several models on one device asks; measured once more before failing, since two shared
cores can stall one burst; the order voice-before-chat itself is asserted on virtual time in
tests/unit/scheduling/test_model_set.py).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from server_launcher import ServerProcess
from waiting import await_until, wait_until

pytestmark = pytest.mark.slow

REPO_MODELS = Path(__file__).resolve().parents[3] / "models"
INT4 = "smollm2-135m-instruct"  # the packaged entry: auto, int4 on the CPU
F32 = "smollm2-135m-f32"

POLICY = f"""
classes:
  voice:
    kind: llm
    model: {F32}
    priority: 0
    max_output_tokens: 8
    targets: {{ttft_ms: 300, itl_ms: 100}}
  chat:
    kind: llm
    model: {INT4}
    priority: 1
    max_output_tokens: 64
    targets: {{ttft_ms: 1000, itl_ms: 150}}
models:
  {F32}: {{pinned: true, kv_cache_mb: 16}}
  {INT4}: {{keep_alive: 5m, kv_cache_mb: 16}}
users:
  default: {{default_class: chat}}
aliases:
  voice: {{class: voice}}
  chat: {{class: chat}}
scheduler: {{max_num_batched_tokens: 512, max_num_seqs: 16}}
"""


def write_repository(folder: Path, pulled: dict[str, Path]) -> Path:
    """The packaged entries plus a float32 entry of the same GGUF, read from the pulled folder."""
    folder.mkdir()
    for entry in REPO_MODELS.glob("*.yaml"):
        shutil.copy(entry, folder / entry.name)
    f32 = {"name": F32, "kind": "llm", "context_length": 8192, "max_model_len": 2048, "dtype": "float32",
           "quantization": "none", "source": {"kind": "hf_folder", "path": str(pulled[INT4])}}
    (folder / f"{F32}.yaml").write_text(yaml.safe_dump(f32))
    return folder


@pytest.fixture(scope="module")
def two_models(pulled_models: dict[str, Path], homeai_cache_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("two-models")
    models = write_repository(data / "models", pulled_models)
    policy = data / "policy.yaml"
    policy.write_text(POLICY)
    server = ServerProcess(data, homeai_cache_dir, policy=policy, env={"HOMEAI_MODELS_DIR": str(models)})
    try:
        server.start()
        yield server
    finally:
        server.stop()


def ask(http: httpx.Client, model: str, text: str = "Say hello.") -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": model, "max_tokens": 8,
                                                   "messages": [{"role": "user", "content": text}]})


def test_both_models_answer_through_one_server(two_models: ServerProcess) -> None:
    with httpx.Client(base_url=two_models.url, timeout=120) as http:
        voice, chat = ask(http, "voice"), ask(http, "chat")
        assert voice.status_code == 200 and chat.status_code == 200, (voice.text, chat.text)
        assert voice.json()["model"] == F32 and chat.json()["model"] == INT4
        assert voice.json()["choices"][0]["message"]["content"]
        assert chat.json()["choices"][0]["message"]["content"]
        stats = http.get("/v1/stats").json()
    device = stats["device"]
    assert device[F32]["weights"] == "none" and device[INT4]["weights"] == "int4"
    assert device[F32]["steps"] > 0 and device[INT4]["steps"] > 0


def loaded_models(http: httpx.Client) -> dict[str, dict[str, object]]:
    return {m["name"].removesuffix(":latest"): m for m in http.get("/api/ps").json()["models"]}


def rss_mb(server: ServerProcess) -> float:
    assert server.proc is not None
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_keep_alive_0_unloads_the_chat_model_and_the_next_request_loads_it(two_models: ServerProcess) -> None:
    with httpx.Client(base_url=two_models.url, timeout=120) as http:
        assert ask(http, "chat").status_code == 200
        ps = loaded_models(http)
        assert set(ps) >= {F32, INT4} and ps[F32]["expires_at"] == "2318-01-01T00:00:00Z"  # pinned
        assert ps[INT4]["expires_at"] < "2318" and ps[INT4]["size"] > 0  # keep_alive 5m
        before = rss_mb(two_models)
        r = http.post("/api/generate", json={"model": INT4, "keep_alive": 0})
        assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
        wait_until(lambda: INT4 not in loaded_models(http), what="the chat model gone from /api/ps")
        assert F32 in loaded_models(http)
        wait_until(lambda: http.get("/v1/stats").json()["models"][INT4]["state"] == "unloaded",
                   what="the chat model's memory freed")
        after = rss_mb(two_models)
        # its weights (int4 nibbles and headers, the int8 embedding: ~110 MB) and KV cache (16 MB) went back to
        # the system (40 MB or less while the pool still held the engine as glibc trimmed)
        assert after < before - 100, (before, after)
        pinned = http.post("/api/generate", json={"model": F32, "keep_alive": 0})
        assert pinned.json()["done_reason"] == "load" and F32 in loaded_models(http)  # pinned: it stays
        r = ask(http, "chat")
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        assert INT4 in loaded_models(http)
        assert http.get("/v1/stats").json()["models"][INT4]["num_loads"] == 2


async def first_token_s(http: httpx.AsyncClient, model: str, max_tokens: int = 4) -> float:
    body = {"model": model, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": "What time is it?"}]}
    start = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - start
    raise AssertionError("no token")


async def voice_ttft_alone_and_under_flood(url: str) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=32)) as http:
        await first_token_s(http, "voice")  # warm
        alone = [await first_token_s(http, "voice") for _ in range(5)]
        flood = [asyncio.create_task(first_token_s(http, "chat", max_tokens=64)) for _ in range(8)]
        await asyncio.sleep(0.5)  # the chat requests are decoding on the other model
        busy = [await first_token_s(http, "voice") for _ in range(5)]
        await asyncio.gather(*flood)
    return statistics.median(alone), statistics.median(busy)


def test_voice_keeps_its_first_token_time_under_a_chat_flood_on_the_other_model(two_models: ServerProcess) -> None:
    for _ in range(2):
        alone, busy = asyncio.run(voice_ttft_alone_and_under_flood(two_models.url))
        print(f"voice TTFT median {alone * 1000:.0f} ms alone, {busy * 1000:.0f} ms under the flood")
        if busy <= 1.5 * alone:
            break
    assert busy <= 1.5 * alone, f"voice TTFT median {alone * 1000:.0f} ms alone, {busy * 1000:.0f} ms under the flood"


async def voice_while_chat_loads(url: str) -> tuple[int, str, int]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        async def state() -> str:
            return str((await http.get("/v1/stats")).json()["models"][INT4]["state"])

        async def unloaded() -> bool:
            return await state() == "unloaded"

        async def loading() -> bool:
            return await state() == "loading"

        assert (await http.post("/api/generate", json={"model": INT4, "keep_alive": 0})).status_code == 200
        await await_until(unloaded, what="the chat model unloaded")
        chat = asyncio.create_task(http.post("/v1/chat/completions", json={
            "model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello?"}]}))
        await await_until(loading, what="the chat model loading")
        voice = await http.post("/v1/chat/completions", json={
            "model": "voice", "max_tokens": 1, "messages": [{"role": "user", "content": "Lights on."}]})
        during = await state()
        return voice.status_code, during, (await chat).status_code


def test_a_load_runs_beside_the_other_models_steps(two_models: ServerProcess) -> None:
    """The chat model loads off the device thread: voice is answered while it loads, and the chat request
    that waited for it is answered once it is in."""
    voice, during, chat = asyncio.run(voice_while_chat_loads(two_models.url))
    assert voice == 200 and chat == 200
    assert during == "loading"  # voice's answer came back before the chat model was even loaded
