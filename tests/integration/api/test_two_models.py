"""Two LLMs on one device through the HTTP server: voice on a float32 entry of the SmolLM2 GGUF, chat on
the packaged entry (int4 on the CPU: the same Q4_1 groups), each with its own KV cache and class scheduler
under the one batcher. Its own server on a model repository of its own (tmp): the second entry reads the
already pulled folder in place, so nothing is downloaded.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from server_launcher import ServerProcess

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
    max_output_tokens: 8
    targets: {{ttft_ms: 1000, itl_ms: 150}}
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
