"""Embedding requests through the batcher: inputs queue per class, the device loop runs the batches.

Each input of a request is one queue item, so Triton's preferred batch sizes count inputs, and a big
indexing request cannot jump ahead of a search query that arrived later in a more important class.
Requests and cancellations are posted to an inbox that the device thread applies (``apply_inbox``): only
that thread touches the batcher's queues.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from homeai.engine.errors import EmbedBatchError, QueueTimeoutError, RequestError
from homeai.engine.health import EngineHealth
from homeai.policy.schema import Policy
from homeai.runtime.embedder import Embedder
from homeai.scheduling.batcher import Batcher, EmbedWork
from homeai.scheduling.class_queue import QueuedItem

log = logging.getLogger(__name__)


def token_rows(embedder: Embedder, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """The token ids of each input: texts are tokenized, token rows checked against the model's length.

    One kind per request: a text among token rows is refused, not read as a row of characters.
    """
    if not inputs:
        raise RequestError("input is empty")
    texts = [x for x in inputs if isinstance(x, str)]
    if texts and len(texts) < len(inputs):
        raise RequestError("input mixes texts and token ids; send one kind")
    if texts:
        return embedder.tokenize(texts)
    rows = [list(x) for x in inputs if not isinstance(x, str)]
    for i, row in enumerate(rows):
        if not row or len(row) > embedder.max_length:
            raise RequestError(f"input[{i}] has {len(row)} tokens; allowed 1..{embedder.max_length}")
    return rows


@dataclass(slots=True)
class EmbedInput:
    token_ids: list[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[np.ndarray]
    model: str | None = None  # the encoder whose tokenizer made token_ids (None: any, e.g. a test's ids)


@dataclass(slots=True)
class EmbedResult:
    vectors: np.ndarray  # [N, dim] float32, unit length
    num_tokens: int


class EmbedService:
    def __init__(self, batcher: Batcher, embedders: dict[str, Embedder],
                 wake: threading.Event | None = None) -> None:
        self.batcher = batcher
        self.embedders = embedders
        self.wake = wake or threading.Event()  # the device loop's: set when a request is posted
        self.health = EngineHealth()  # failures of embedding batches (/readyz, /metrics)
        self._ids = itertools.count()
        self._inbox: list[tuple[str, str, list[QueuedItem]]] = []  # (push | cancel, class, items)
        self._inbox_lock = threading.Lock()

    def forget_unused(self, wanted: set[str]) -> list[str]:
        """Device thread, after a policy swap: drop the encoders no class of the applied policy nor of a newer
        one uses (one a swap left stayed loaded for good, ~90 MB for MiniLM, more for larger ones); a request
        that still holds one finishes with it, its inputs fail as moved. Returns the names dropped."""
        gone = [name for name in list(self.embedders) if name not in wanted]
        for name in gone:
            self.embedders.pop(name, None)
            log.info("embedding model %s unloaded: no class of the policy uses it", name)
        return gone

    def model_for(self, class_name: str, policy: Policy) -> Embedder:
        cp = policy.classes.get(class_name)
        if cp is None or cp.kind != "embedding":
            raise RequestError(f"class {class_name!r} is not an embedding class")
        emb = self.embedders.get(cp.model)
        if emb is None:
            raise RequestError(f"embedding model {cp.model!r} of class {class_name!r} is not loaded")
        return emb

    async def embed(self, class_name: str, inputs: list[str] | list[list[int]], user: str = "default",
                    priority_level: int | None = None, timeout_us: int | None = None,
                    model: str | None = None) -> EmbedResult:
        """``model``: the encoder whose tokenizer made token rows in ``inputs`` (routed before a policy swap
        may have moved the class: the device thread then fails them, rather than embedding one tokenizer's
        ids with another encoder); None: the class's encoder now."""
        policy = self.batcher.policy
        embedder = self.model_for(class_name, policy)
        if model is not None and model != policy.classes[class_name].model:
            embedder = self.embedders.get(model) or embedder  # rows checked against their own encoder's length
        rows = token_rows(embedder, inputs)
        loop = asyncio.get_running_loop()
        model = model or policy.classes[class_name].model
        items = [QueuedItem(f"emb-{next(self._ids)}", user, priority_level=priority_level,
                            timeout_override_us=timeout_us, cost=len(row),
                            payload=EmbedInput(row, loop, loop.create_future(), model)) for row in rows]
        self.submit(class_name, items)
        try:
            vectors = await asyncio.gather(*(it.payload.future for it in items))  # QueueFullError -> 429
        except BaseException:
            self.cancel(class_name, items)
            raise
        return EmbedResult(np.stack(vectors), sum(len(r) for r in rows))

    def submit(self, class_name: str, items: list[QueuedItem]) -> None:
        """Post one request's inputs (payloads are EmbedInput); the device thread queues them."""
        self._post("push", class_name, items)

    def cancel(self, class_name: str, items: list[QueuedItem]) -> None:
        """Post the withdrawal of a request's inputs (its caller went away)."""
        self._post("cancel", class_name, items)

    def _post(self, kind: str, class_name: str, items: list[QueuedItem]) -> None:
        with self._inbox_lock:
            self._inbox.append((kind, class_name, items))
        self.wake.set()

    def apply_inbox(self) -> None:
        """Device thread: queue posted requests (all inputs of one, or none of them if its queue is
        full for its first: the caller gets QueueFullError) and drop cancelled ones, in posting order."""
        with self._inbox_lock:
            posted, self._inbox = self._inbox, []
        for kind, class_name, items in posted:
            if kind == "cancel":
                for it in items:
                    self.batcher.cancel_embedding(class_name, it.request_id)
                continue
            pushed: list[QueuedItem] = []
            try:
                now_on = self._moved(class_name, items[0].payload.model)
                if now_on is not None:  # tokenized for the encoder the class left while the request was posted
                    raise QueueTimeoutError(f"class {class_name!r} now runs on model {now_on!r}, "
                                            f"not {items[0].payload.model!r}")
                for it in items:
                    self.batcher.push_embedding(class_name, it, follows=bool(pushed))
                    pushed.append(it)
            except Exception as exc:  # QueueFullError, an unknown class: the whole request fails
                for it in pushed:
                    self.batcher.cancel_embedding(class_name, it.request_id)
                # The caller's gather raises the first error; the other inputs are cancelled, so no
                # future is left holding an exception nobody retrieves.
                self._deliver([(items[0].payload, exc), *((it.payload, _CANCEL) for it in items[1:])])

    def _moved(self, class_name: str, model: str | None) -> str | None:
        """The encoder ``class_name`` runs on now, where it is not ``model`` (None: the same, or unknown)."""
        cp = self.batcher.policy.classes.get(class_name)
        return cp.model if cp is not None and model is not None and cp.model != model else None

    def run(self, work: EmbedWork) -> None:
        """Device thread: embed one batch and hand each vector to its waiting request. A failure fails
        this batch's requests only (each future gets the error; nothing else is touched)."""
        items = [it for it in work.items if not it.payload.future.done()]
        if not items:
            return
        try:
            embedder = self.model_for(work.class_name, self.batcher.policy)
            vectors = embedder.embed(token_ids=[it.payload.token_ids for it in items]).numpy()
        except Exception as exc:  # noqa: BLE001 - contained to this batch
            self.health.failed("embed_batch", exc)
            log.error("embedding batch of %d inputs (class %s) failed", len(items), work.class_name, exc_info=exc)
            self._deliver([(it.payload, EmbedBatchError(f"embedding failed: {type(exc).__name__}: {exc}"))
                           for it in items])
            return
        self.health.succeeded()
        self._deliver([(it.payload, vec) for it, vec in zip(items, vectors, strict=True)])

    def fail_expired(self) -> None:
        """Inputs past their queue timeout, and those a policy swap retired (their class left the policy or
        moved to another encoder): each fails with why (HTTP 503); those a full queue pushed out for another
        user's fail with its 429."""
        failed: list[tuple[EmbedInput, Exception]] = [
            (it.payload, QueueTimeoutError(f"queue timeout in class {name!r}"))
            for name, it in self.batcher.expire_embeddings()]
        failed += [(it.payload, QueueTimeoutError(reason)) for _, it, reason in self.batcher.retired_embeddings()]
        failed += [(it.payload, refusal) for _, it, refusal in self.batcher.pushed_out_embeddings()]
        if failed:
            self._deliver(failed)

    def fail_all(self, message: str) -> None:
        """Device thread, the loop's last resort when it keeps failing outside any batch: every posted or
        queued input fails with ``message`` (HTTP 500), so that no caller waits on a loop that cannot serve."""
        with self._inbox_lock:
            posted, self._inbox = self._inbox, []
        failed = [it.payload for kind, _, items in posted if kind == "push" for it in items]
        failed += [it.payload for it in self.batcher.take_all_embeddings()]
        self._deliver([(inp, EmbedBatchError(message)) for inp in failed if not inp.future.done()])

    @staticmethod
    def _deliver(results: list[tuple[EmbedInput, Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[EmbedInput, Any]]] = defaultdict(list)
        for inp, value in results:
            by_loop[inp.loop].append((inp, value))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, batch)
            except RuntimeError:
                pass


_CANCEL = object()  # delivered to an input whose request already failed on another input


def _resolve(batch: list[tuple[EmbedInput, Any]]) -> None:
    for inp, value in batch:
        if inp.future.done():
            continue
        if value is _CANCEL:
            inp.future.cancel()
        elif isinstance(value, BaseException):
            inp.future.set_exception(value)
        else:
            inp.future.set_result(value)
