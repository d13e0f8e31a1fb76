"""A policy change that names another embedding model loads it in the background: until it is loaded the
class's requests get a 503 with Retry-After, then they are served by it. Before, encoders loaded only at
start, and every request of a class moved to another encoder failed (KeyError, a 500) until a restart."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from homeai.api.errors import to_api_error
from homeai.engine.errors import ModelLoadError, ModelLoadingError
from homeai.gateway import gateway as gateway_module
from homeai.gateway.gateway import Gateway
from homeai.policy.loader import load_policy
from homeai.policy.schema import Policy
from homeai.policy.store import PolicyHolder

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def on_encoder(policy: Policy, class_name: str, model: str) -> Policy:
    moved = policy.classes[class_name].model_copy(update={"model": model})
    return policy.model_copy(update={"classes": {**policy.classes, class_name: moved}})


def test_a_new_embedding_model_loads_in_the_background_and_answers_503_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    policy = load_policy(DEFAULT_POLICY)
    gateway = Gateway(PolicyHolder(policy))
    gateway.embedders["all-minilm-l6-v2"] = object()  # type: ignore[assignment]
    loading, loaded = threading.Event(), object()
    fail = {"bge-small": False}

    def load(folder: Path, device: Any) -> object:
        loading.wait(10)
        if fail.get(folder.name):
            raise OSError("disk on fire")
        return loaded

    monkeypatch.setattr(gateway_module.Embedder, "load", staticmethod(load))
    monkeypatch.setattr(Gateway, "_folder", lambda self, entry: Path(entry))
    monkeypatch.setattr(Gateway, "_entry", lambda self, name: name)
    moved = on_encoder(policy, "indexing", "bge-small")
    gateway._follow_encoders(moved)
    with pytest.raises(ModelLoadingError) as waiting:
        gateway.embedder("bge-small")
    answer = to_api_error(waiting.value)
    assert answer.status_code == 503 and answer.headers.get("Retry-After") == "2"
    gateway._follow_encoders(moved)  # a second change meanwhile: one load, not two
    assert len(gateway._encoder_loads) == 1
    loading.set()
    gateway._encoder_loads["bge-small"].join(10)
    assert gateway.embedder("bge-small") is loaded
    assert gateway.embedder("all-minilm-l6-v2") is not None  # the one before stays for what was queued on it

    fail["other"] = True
    moved = on_encoder(moved, "embedding", "other")
    gateway._follow_encoders(moved)
    gateway._encoder_loads["other"].join(10)
    with pytest.raises(ModelLoadError, match="disk on fire"):
        gateway.embedder("other")
