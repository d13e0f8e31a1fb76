"""Resolving Ollama model names in a store laid out as Ollama lays it out (built in a temp folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homeai.repository.ollama import MODEL_LAYER, OllamaError, default_store, parse_model, resolve

DIGEST = "ab" * 32


def make_store(root: Path, layers: list[dict[str, str]], name: str = "library/smol", tag: str = "latest") -> Path:
    manifest = root / "manifests" / "registry.ollama.ai" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    (root / "blobs").mkdir(exist_ok=True)
    return manifest


def test_parse_model() -> None:
    assert parse_model("smol") == ("library/smol", "latest")
    assert parse_model("smol:135m") == ("library/smol", "135m")
    assert parse_model("me/smol:q8_0") == ("me/smol", "q8_0")
    assert parse_model("smol:") == ("library/smol", "latest")
    for bad in ("a/b/c", "../x", ":tag", "smol:a/b"):
        with pytest.raises(OllamaError, match="not an Ollama model name"):
            parse_model(bad)


def test_resolve_finds_the_model_blob(tmp_path: Path) -> None:
    make_store(tmp_path, [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
                          {"mediaType": MODEL_LAYER, "digest": f"sha256:{DIGEST}"}])
    (tmp_path / "blobs" / f"sha256-{DIGEST}").write_bytes(b"GGUF")
    found = resolve("smol", tmp_path)
    assert (found.name, found.tag, found.digest) == ("library/smol", "latest", DIGEST)
    assert found.blob == tmp_path / "blobs" / f"sha256-{DIGEST}"


def test_resolve_errors_say_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(OllamaError, match="no manifest"):
        resolve("smol", tmp_path)
    make_store(tmp_path, [{"mediaType": MODEL_LAYER, "digest": f"sha256:{DIGEST}"}])
    with pytest.raises(OllamaError, match="blob .* is missing"):
        resolve("smol", tmp_path)
    make_store(tmp_path, [{"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:" + "1" * 64}],
               tag="nomodel")
    with pytest.raises(OllamaError, match="no single sha256 model layer"):
        resolve("smol:nomodel", tmp_path)


def test_default_store_follows_ollama_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    assert default_store() == tmp_path
    monkeypatch.delenv("OLLAMA_MODELS")
    assert default_store() == Path.home() / ".ollama" / "models"
