"""One way in for embedding requests (OpenAI /v1/embeddings, Ollama /api/embed and /api/embeddings, and
the search route's query): route once, tokenize each input once, refuse or cut what is too long, queue
every input in the class, wait for the vectors.

The encoder embeds at most ``max_length`` tokens ([CLS] and [SEP] included; 256 for all-minilm-l6-v2)
and its tokenizer silently cuts longer texts, so a search could miss everything past the cut and
nobody would know. OpenAI's /v1/embeddings refuses such an input with a 400 naming it; Ollama's
/api/embed has ``truncate`` (default true: cut; false: refuse).
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request

from homeai.api.errors import BadRequest, to_api_error
from homeai.api.offload import INLINE_CHARS, text_size
from homeai.api.routing import RequestContext, check_token_ids, request_context, route_request, warn_num_ctx
from homeai.api.streaming import until_disconnect
from homeai.engine.embed_service import EmbedResult
from homeai.gateway.gateway import Gateway, Route
from homeai.runtime.embedder import Embedder


async def admit_embedding(request: Request[Any, Any, Any], gateway: Gateway, model: str | None,
                          inputs: list[str] | list[list[int]], *, cut_long: bool, body_user: str | None = None,
                          dimensions: int | None = None, num_ctx: int | None = None) -> tuple[Route, EmbedResult]:
    """Route, check and embed ``inputs`` (texts, or token rows); ``cut_long``: cut inputs longer than the
    model takes (else a 400 naming the first); ``dimensions``: a size the caller expects (a 400 unless
    it is the model's); ``num_ctx`` (Ollama's option): served in the model's own length above it (logged)."""
    ctx = await request_context(request, body_user)
    route = route_request(gateway, model, ctx, "embedding")
    embedder = gateway.embedder(route.model)
    if dimensions is not None and dimensions != embedder.dim:
        raise BadRequest(f"model {route.model!r} gives {embedder.dim} dimensions", param="dimensions")
    if num_ctx is not None and num_ctx > embedder.max_length:  # served in the model's own, as Ollama does
        warn_num_ctx(route.model, num_ctx, embedder.max_length)
    return route, await run_embedding(request, gateway, route, inputs, ctx, cut_long)


async def embedding_rows(embedder: Embedder, texts: list[str], cut_long: bool, limit: int) -> list[list[int]]:
    """Token ids of ``texts``: here when short and the tokenizer is free, else on a worker thread (never
    waiting on the event loop for a tokenization another thread runs)."""
    rows = embedder.tokenize_if_free(texts, cut_long, limit) if text_size(texts) <= INLINE_CHARS else None
    if rows is None:
        rows = await asyncio.to_thread(embedder.tokenize, texts, cut_long, limit)
    return rows


async def run_embedding(request: Request[Any, Any, Any], gateway: Gateway, route: Route,
                        inputs: list[str] | list[list[int]], ctx: RequestContext,
                        cut_long: bool = True) -> EmbedResult:
    """Tokenize once (off the event loop unless short: ``offload``); queue every input in the class; wait for
    the vectors."""
    embedder = gateway.embedder(route.model)
    # the class's max_prompt_tokens, where it is below what the model takes (it was not applied to embeddings)
    class_limit = gateway.class_policy(route.class_name).max_prompt_tokens
    limit = min(class_limit, embedder.max_length) if class_limit else embedder.max_length
    texts = [x for x in inputs if isinstance(x, str)]
    if texts and len(texts) < len(inputs):
        raise BadRequest("input mixes texts and token ids; send one kind", param="input")
    if texts:
        rows = await embedding_rows(embedder, texts, cut_long, limit)
    else:
        rows = [list(r) for r in inputs if not isinstance(r, str)]
        for i, row in enumerate(rows):
            check_token_ids(row, embedder.tokenizer_size, f"input[{i}]")
        if cut_long:
            rows = [row[:limit] for row in rows]
    if not cut_long:
        check_lengths(rows, limit, route.model, class_name=route.class_name if limit < embedder.max_length else None)
    try:
        return await until_disconnect(request, gateway.embed(route, rows, ctx.user, ctx.priority_level,
                                                             ctx.timeout_us))
    except Exception as exc:
        raise to_api_error(exc) from None


def check_lengths(rows: list[list[int]], limit: int, model: str, field: str = "input",
                  class_name: str | None = None) -> None:
    """BadRequest naming the first input over ``limit`` tokens (``class_name``: the class's limit, not the model's)."""
    whose = f"class {class_name!r}" if class_name else f"model {model!r}"
    for i, row in enumerate(rows):
        if len(row) > limit:
            param = f"{field}[{i}]" if len(rows) > 1 else field
            raise BadRequest(f"{param} has {len(row)} tokens; {whose} embeds at most {limit} tokens per "
                             "input. Shorten it or split it into several inputs.", param=param,
                             code="context_length_exceeded")
