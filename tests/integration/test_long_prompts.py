"""Long prompts through the HTTP server, in every weight format the model can be served in.

For float32, int8 and int4 (the default for SmolLM2's Q4_1 GGUF) a real server answers four prompts close
to the model's max_model_len at once (~1,800 tokens each: many prefill chunks, steps that sample nothing;
together more than the default KV pool holds: admission waits and preemption), beside them a request
of a single output token, and a grammar-constrained request beside free ones. Every answer arrives,
none is an error, and the engine counted no failure.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest
import yaml
from server_launcher import running_server

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
REPO_MODELS = Path(__file__).resolve().parents[2] / "models"
WORD = " apple"  # one token in SmolLM2's vocabulary: the prompt's length is what we ask for


def models_dir_with(tmp_path: Path, quantization: str) -> Path:
    """A copy of the model repository whose SmolLM2 entry asks for ``quantization``."""
    folder = tmp_path / f"models-{quantization}"
    shutil.copytree(REPO_MODELS, folder)
    entry_path = folder / f"{MODEL}.yaml"
    entry = yaml.safe_load(entry_path.read_text())
    entry["quantization"] = quantization
    entry_path.write_text(yaml.safe_dump(entry))
    return folder


def chat(text: str, max_tokens: int, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


async def ask(client: httpx.AsyncClient, body: dict[str, object]) -> dict[str, object]:
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("quantization", ["none", "int8", "auto"])
def test_long_prompts_in_every_format(pulled_models: dict[str, Path], homeai_cache_dir: Path, tmp_path: Path,
                                      quantization: str) -> None:
    env = {"HOMEAI_MODELS_DIR": str(models_dir_with(tmp_path, quantization))}
    long_text = "Summarize this list:" + WORD * 1780
    with running_server(tmp_path / "data", homeai_cache_dir, env=env) as server:

        async def run() -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
                served = (await client.get("/v1/stats")).json()["device"][MODEL]
                assert served["weights"] == {"none": "none", "int8": "int8", "auto": "int4"}[quantization]
                answers = await asyncio.gather(
                    *(ask(client, chat(f"Note {i}. " + long_text, 8, ignore_eos=True)) for i in range(4)),
                    ask(client, chat("Say hi.", 1)),
                    ask(client, chat("Give me a JSON object with a name.", 24,
                                     response_format={"type": "json_object"})),
                    ask(client, chat("Count to five.", 12)))
                for answer in answers[:4]:
                    usage = answer["usage"]
                    assert isinstance(usage, dict) and 1780 <= usage["prompt_tokens"] < 2048
                    assert usage["completion_tokens"] == 8
                assert answers[4]["usage"]["completion_tokens"] == 1  # type: ignore[index]
                constrained = answers[5]["choices"][0]  # type: ignore[index]
                if constrained["finish_reason"] == "stop":
                    assert isinstance(json.loads(constrained["message"]["content"]), dict)
                health = (await client.get("/v1/stats")).json().get("engine_health")
                if health is not None:
                    assert health["errors"] == [], health

        asyncio.run(run())
