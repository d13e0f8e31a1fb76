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


class FootprintCatalog:
    """What the pool's budget reads of the repository: each model's estimated bytes."""

    device_memory_bytes = 8 * 2**30
    sizes = {"all-minilm-l6-v2": 90 * 2**20, "bge-small": 130 * 2**20}

    def footprint_bytes(self, policy: Policy, name: str, kind: str) -> int:
        return self.sizes[name] if kind == "embedding" else 600 * 2**20


def test_the_model_pool_counts_the_encoders_the_policy_names_after_a_swap() -> None:
    """The encoders' memory was counted once, at start: a swap that moved every embedding class to another
    encoder left the dropped one's bytes held in the LLMs' budget for good, and never counted the new one."""
    from homeai.gateway.model_pool import ModelPool

    policy = load_policy(DEFAULT_POLICY)
    gateway = Gateway(PolicyHolder(policy))
    gateway.pool = ModelPool(None, load=lambda name: None, attach=lambda n, e: None,  # type: ignore[arg-type,return-value]
                             detach=lambda n: None, free=lambda e: None,  # type: ignore[arg-type,return-value]
                             measure=lambda e: (0, 0))
    catalog = FootprintCatalog()
    gateway._configure_pool(policy, catalog)  # type: ignore[arg-type]
    assert gateway.pool.fixed_bytes == 90 * 2**20
    moved = on_encoder(on_encoder(policy, "indexing", "bge-small"), "embedding", "bge-small")
    gateway._configure_pool(moved, catalog)  # type: ignore[arg-type]
    assert gateway.pool.fixed_bytes == 130 * 2**20
    assert gateway.pool.held_bytes() == 130 * 2**20  # no LLM loaded in this test: the encoder alone
