"""`homeai pull` from what a household already has: a GGUF file and an Ollama store (manifest + blob,
built in a temp folder), each read in place, recorded with its sha256, and serving a chat whose greedy
reply equals the packaged model's (same weights, so the same tokens)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from homeai.cli.repository_cmds import main as cli_main
from homeai.core.types import SamplingParams
from homeai.engine.builder import EngineConfig, build_llm_engine, chat_prompt_ids
from homeai.engine.device_loop import run_alone
from homeai.repository.entries import get_entry, load_entry
from homeai.repository.pull import ChecksumError, PullError, pull
from homeai.runtime.llama import GGUF_WEIGHTS

pytestmark = pytest.mark.slow
LLM = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def packaged_gguf(pulled_models: dict[str, Path]) -> Path:
    gguf_file = get_entry(LLM).gguf_file
    assert gguf_file is not None
    return pulled_models[LLM] / gguf_file


def chat_reply(folder: Path, quantization: str = "none") -> list[int]:
    engine = build_llm_engine(folder, EngineConfig(device="cpu", dtype="float32", kv_cache_mb=16,
                                                   quantization=quantization))
    loop = run_alone(engine)

    async def run() -> list[int]:
        ids: list[int] = []
        prompt = chat_prompt_ids(engine.tokenizer, QUESTION)
        async for delta in engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12)):
            ids += delta.token_ids
        return ids

    try:
        return asyncio.run(run())
    finally:
        loop.shutdown()


@pytest.fixture(scope="module")
def packaged_reply(pulled_models: dict[str, Path]) -> list[int]:
    return chat_reply(pulled_models[LLM])


def ollama_store(root: Path, gguf: Path, name: str = "smollm2", tag: str = "135m") -> str:
    """Ollama's layout: a content-addressed blob and a manifest naming it as the model layer."""
    digest = sha256(gguf)
    (root / "blobs").mkdir(parents=True)
    shutil.copyfile(gguf, root / "blobs" / f"sha256-{digest}")
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": gguf.stat().st_size},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 10}]}))
    return digest


def test_pull_local_gguf_serves_a_chat(packaged_gguf: Path, packaged_reply: list[int], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "mine" / "SmolLM2.Q4_1.gguf"
    copy.parent.mkdir()
    shutil.copyfile(packaged_gguf, copy)
    copy.chmod(0o444)  # read in place: a read-only file is enough
    models, cache = tmp_path / "models", tmp_path / "cache"
    monkeypatch.setenv("HOMEAI_MODELS_DIR", str(models))
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(cache))
    assert cli_main(["pull", str(copy), "--as", "my-smol"]) == 0
    assert "ready at" in capsys.readouterr().out
    entry = load_entry(models / "my-smol.yaml")
    assert entry.source.kind == "gguf" and entry.source.sha256 == sha256(copy)  # type: ignore[union-attr]
    folder = entry.local_path(cache)
    assert (folder / GGUF_WEIGHTS).resolve() == copy and not list(folder.glob("*.safetensors"))
    assert chat_reply(folder) == packaged_reply
    assert chat_reply(folder, "int8")[:6] == packaged_reply[:6]  # int8 straight from the GGUF tensors: "Paris"
    copy.chmod(0o644)
    with copy.open("r+b") as f:  # the file changed after it was added: the next pull says so
        f.seek(-1, 2)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    with pytest.raises(ChecksumError):
        pull(entry, cache, progress=False, force=True)


def test_a_linked_gguf_that_went_away_is_not_present_and_a_pull_links_it_again(
        packaged_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The marker alone made a model present: after its linked GGUF was moved away (Ollama prunes old blobs)
    `homeai pull` said "ready" over a model that could not load, and `homeai models` crashed."""
    copy = tmp_path / "mine" / "SmolLM2.Q4_1.gguf"
    copy.parent.mkdir()
    shutil.copyfile(packaged_gguf, copy)
    models, cache = tmp_path / "models", tmp_path / "cache"
    monkeypatch.setenv("HOMEAI_MODELS_DIR", str(models))
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(cache))
    assert cli_main(["pull", str(copy), "--as", "my-smol"]) == 0
    entry = load_entry(models / "my-smol.yaml")
    assert entry.is_present(cache)
    moved = copy.rename(tmp_path / "elsewhere.gguf")
    assert not entry.is_present(cache)
    capsys.readouterr()
    assert cli_main(["models"]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("my-smol")][0].split()[5] == "no"
    moved.rename(copy)
    assert cli_main(["pull", "my-smol"]) == 0 and entry.is_present(cache)


def test_pull_from_an_ollama_store_serves_a_chat(packaged_gguf: Path, packaged_reply: list[int], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "ollama"
    digest = ollama_store(store, packaged_gguf)
    before = {p: p.stat().st_mtime_ns for p in store.rglob("*")}
    models, cache = tmp_path / "models", tmp_path / "cache"
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    monkeypatch.setenv("HOMEAI_MODELS_DIR", str(models))
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(cache))
    assert cli_main(["pull", "ollama:smollm2:135m"]) == 0
    raw = yaml.safe_load((models / "smollm2-135m.yaml").read_text())
    assert raw["source"] == {"kind": "ollama", "model": "smollm2:135m", "digest": digest, "store": str(store)}
    assert raw["context_length"] == 8192 and raw["max_model_len"] == 2048
    folder = get_entry("smollm2-135m").local_path(cache)
    assert (folder / GGUF_WEIGHTS).resolve() == store / "blobs" / f"sha256-{digest}"
    assert chat_reply(folder) == packaged_reply
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*")} == before  # the store is only read
    assert cli_main(["pull", "ollama:smollm2:7b"]) == 1  # no such tag: a clear error, exit 1


def test_unsupported_sources_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOMEAI_MODELS_DIR", str(tmp_path / "models"))
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert cli_main(["pull", str(folder)]) == 1
    assert "GPT2LMHeadModel" in capsys.readouterr().err
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "quantization_config": {"quant_method": "gptq"}}))
    assert cli_main(["pull", str(folder)]) == 1
    assert "gptq" in capsys.readouterr().err
    with pytest.raises(PullError, match="not a model name"):
        from homeai.repository.sources import entry_for

        entry_for(str(tmp_path / "nothing-here"))


def test_pull_a_hugging_face_folder_records_its_files(pulled_models: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    folder = pulled_models[LLM]  # the packaged model's converted folder is a plain HF folder
    models = tmp_path / "models"
    monkeypatch.setenv("HOMEAI_MODELS_DIR", str(models))
    assert cli_main(["pull", str(folder), "--as", "smol-folder", "--quantization", "int8"]) == 0
    entry = load_entry(models / "smol-folder.yaml")
    assert entry.source.kind == "hf_folder" and entry.quantization == "int8"
    recorded = {f.path: f.sha256 for f in entry.source.files}  # type: ignore[union-attr]
    assert recorded["model.safetensors"] == sha256(folder / "model.safetensors") and "config.json" in recorded
    assert pull(entry, tmp_path / "cache", progress=False) == folder  # loaded where it is, nothing copied
