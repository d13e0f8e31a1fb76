"""The indexer's embedder over the gateway, when a policy swap moves its class to another encoder mid-run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from homeai.jobs.gateway_embedder import GatewayTextEmbedder, ModelMovedError


class Gateway:
    """The class's encoder is ``self.model``; ``embed`` records the route each batch went by."""

    def __init__(self) -> None:
        self.model = "e"
        self.policy = SimpleNamespace(classes={"indexing": SimpleNamespace(model="e", max_prompt_tokens=None)})
        self.embedded: list[str] = []
        backend = Tokenizer(WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
        backend.pre_tokenizer = Whitespace()
        self.limits: list[int | None] = []
        self.encoder = SimpleNamespace(tokenizer=backend, max_length=256, dim=3, tokenize=self._tokenize)

    def _tokenize(self, texts: list[str], truncate: bool = True, max_length: int | None = None) -> list[list[int]]:
        self.limits.append(max_length)
        return [[1] for _ in texts]

    def route(self, *_: Any) -> Any:
        return SimpleNamespace(model=self.model, class_name="indexing")

    def embedder(self, model: str) -> Any:
        return self.encoder

    async def embed(self, route: Any, rows: list[list[int]], user: str) -> Any:
        self.embedded.append(route.model)
        return SimpleNamespace(vectors=np.ones((len(rows), 3), dtype=np.float32))


async def test_a_run_ends_when_its_class_moves_to_another_encoder() -> None:
    """Before: the rows the old encoder's tokenizer made went on to the new encoder (after a 503 each, retried
    with the same rows), and the index held vectors of two models."""
    gateway = Gateway()
    embedder = GatewayTextEmbedder(gateway)
    assert (await embedder.embed(["hi"])).shape == (1, 3)
    gateway.model = "e2"
    with pytest.raises(ModelMovedError, match="now runs on model 'e2', not 'e'"):
        await embedder.embed(["hi"])
    assert gateway.embedded == ["e"]


async def test_indexing_holds_the_classs_max_prompt_tokens() -> None:
    """Found by a review: the API path held the class's max_prompt_tokens, the indexer (the path that serves
    the indexing class) cut chunks at the encoder's 254 tokens whatever the class said."""
    gateway = Gateway()
    gateway.policy.classes["indexing"].max_prompt_tokens = 64
    embedder = GatewayTextEmbedder(gateway)
    assert embedder.max_chunk_tokens == 62  # 64 less [CLS] and [SEP]
    await embedder.embed(["hi"])
    assert gateway.limits == [64]
    gateway.policy.classes["indexing"].max_prompt_tokens = 1000  # above the encoder's: the encoder's
    assert GatewayTextEmbedder(gateway).max_chunk_tokens == 254
