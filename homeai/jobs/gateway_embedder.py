"""Embeddings for jobs through the gateway's queues: a job is one more client of a (background) class.

Texts are tokenized exactly as the interactive path does it (``Embedder.tokenize``, off the event
loop), then queued in the class as user ``indexer``; a full queue or a queue timeout is waited out and
retried, since background work has all night. Chunking uses a private copy of the same tokenizer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np

from homeai.engine.errors import QueueTimeoutError
from homeai.jobs.chunking import hf_token_offsets
from homeai.scheduling.class_queue import QueueFullError

log = logging.getLogger(__name__)

INDEXING_CLASS = "indexing"
INDEXER_USER = "indexer"
MAX_RETRIES = 100


class ModelMovedError(RuntimeError):
    """The embedding class moved to another encoder during a run: its chunks would mix two models."""


class GatewayTextEmbedder:
    """``TextEmbedder`` over ``Gateway.embed`` in ``class_name`` (the policy's default embedding class
    when the policy has no such class)."""

    def __init__(self, gateway: Any, class_name: str = INDEXING_CLASS, user: str = INDEXER_USER) -> None:
        self.gateway = gateway
        self.class_name = class_name
        self.user = user
        route = self._route()
        self.model = route.model
        self.embedder = gateway.embedder(route.model)
        self.token_offsets = hf_token_offsets(self.embedder.tokenizer)
        self.max_chunk_tokens = self._limit() - 2  # [CLS] and [SEP]
        self.dim = int(self.embedder.dim)

    def _route(self) -> Any:
        """Asked again per batch: a hot-reloaded policy may move the class."""
        known = self.class_name in self.gateway.policy.classes
        return self.gateway.route(None, self.class_name if known else None, "embedding", self.user)

    def _limit(self) -> int:
        """Tokens an input may have: the encoder's, or the class's ``max_prompt_tokens`` below it (the API
        path held it; indexing, the path that serves the class, embedded 254-token chunks whatever it said)."""
        cp = self.gateway.policy.classes.get(self.class_name)
        model_max = int(self.embedder.max_length)
        return min(cp.max_prompt_tokens, model_max) if cp is not None and cp.max_prompt_tokens else model_max

    async def embed(self, texts: list[str]) -> np.ndarray:
        rows = await asyncio.to_thread(self.embedder.tokenize, texts, True, self._limit())
        for attempt in range(MAX_RETRIES):
            route = self._route()
            if route.model != self.model:  # a policy swap moved the class: these rows are the old tokenizer's
                raise ModelMovedError(f"the {self.class_name!r} class now runs on model {route.model!r}, not "
                                      f"{self.model!r}: the next run indexes with it")
            try:
                result = await self.gateway.embed(route, rows, self.user)
                return np.asarray(result.vectors, dtype=np.float32)
            except QueueFullError as e:
                wait_s = max(0.5, float(getattr(e, "retry_after_s", 1.0) or 1.0))
            except QueueTimeoutError:
                wait_s = 0.5
            if attempt == 0:
                log.info("indexing queue busy; retrying in %.1f s", wait_s)
            await asyncio.sleep(wait_s)
        raise RuntimeError(f"the {self.class_name!r} queue stayed full")
