"""OpenAI-compatible routes: chat and text completions, embeddings, models.

A household app changes only its base URL to ``http://<server>:8000/v1``. Each LLM route is three calls:
the adapter (``openai_chat``) makes the body one typed request, ``admission.admit`` routes, checks and
submits it, the encoder (``openai_stream``) writes the answer as OpenAI's SSE chunks or one body.
"""

from __future__ import annotations

import base64
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.openapi.datastructures import ResponseSpec

from homeai.api.admission import admit
from homeai.api.embedding_admission import admit_embedding
from homeai.api.errors import BadRequest, NotFound
from homeai.api.openai_chat import chat_request, completion_request, echo_text
from homeai.api.openai_schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    EmbeddingData,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    ErrorBody,
    ModelCard,
    ModelList,
)
from homeai.api.openai_stream import CHAT_CHUNK, TEXT_COMPLETION, chat_completion, stream_chunks, text_completion
from homeai.api.services import Injected
from homeai.api.streaming import sse_stream
from homeai.gateway.gateway import Gateway

MAX_EMBEDDING_INPUTS = 2048


def documented(body: type, what: str) -> dict[int, ResponseSpec]:
    """OpenAPI responses: the 200 body (SSE when streaming) and our error shape for each status we send."""
    errors = {400: "invalid request (names the field)", 404: "unknown model", 413: "body too large",
              429: "class queue full (Retry-After)", 503: "queue timeout or engine starting (Retry-After)"}
    return {200: ResponseSpec(body, description=what),
            **{code: ResponseSpec(ErrorBody, description=text) for code, text in errors.items()}}


class OpenAIController(Controller):
    """/v1: what the ``openai`` package and OpenAI-speaking apps call."""

    path = "/v1"
    tags = ["openai"]

    @post("/chat/completions", status_code=200, summary="Chat completion (SSE when stream is true)",
          responses=documented(ChatCompletion, "the completion; with stream, SSE chunks and data: [DONE]"))
    async def chat_completions(self, request: Request[Any, Any, Any], data: ChatCompletionRequest,
                               gateway: Injected[Gateway]) -> Response[Any]:
        req = chat_request(data)
        admitted = await admit(request, gateway, req)
        if data.stream:
            include = bool(data.stream_options and data.stream_options.include_usage)
            return sse_stream(stream_chunks(admitted, CHAT_CHUNK, include))
        return Response(await chat_completion(admitted, req.logprobs is not None))

    @post("/completions", status_code=200, summary="Text completion (SSE when stream is true)",
          responses=documented(Completion, "the completion; with stream, SSE chunks and data: [DONE]"))
    async def completions(self, request: Request[Any, Any, Any], data: CompletionRequest,
                          gateway: Injected[Gateway]) -> Response[Any]:
        req = completion_request(data)
        if data.echo and data.logprobs is not None:  # OpenAI's answer would score the prompt's tokens too
            raise BadRequest("echo with logprobs is not supported: the prompt's tokens are not scored", param="echo")
        admitted = await admit(request, gateway, req)
        echo = echo_text(gateway, admitted.generation.route.model, req) if data.echo else ""
        if data.stream:
            include = bool(data.stream_options and data.stream_options.include_usage)
            return sse_stream(stream_chunks(admitted, TEXT_COMPLETION, include, prefix=echo))
        return Response(await text_completion(admitted, echo, data.logprobs is not None))

    @post("/embeddings", status_code=200, summary="Embeddings of strings or token arrays",
          responses=documented(EmbeddingList, "one vector per input (floats or base64 little-endian float32)"))
    async def embeddings(self, request: Request[Any, Any, Any], data: EmbeddingRequest,
                         gateway: Injected[Gateway]) -> EmbeddingList:
        inputs = embedding_inputs(data.input)
        route, result = await admit_embedding(request, gateway, data.model, inputs, cut_long=False,
                                              body_user=data.user, dimensions=data.dimensions)  # OpenAI never cuts
        vectors = result.vectors.astype("<f4")
        items = [EmbeddingData(i, base64.b64encode(v.tobytes()).decode() if data.encoding_format == "base64"
                               else v.tolist()) for i, v in enumerate(vectors)]
        return EmbeddingList(items, route.model, EmbeddingUsage(result.num_tokens, result.num_tokens))

    @get("/models", summary="Served models and the policy's model aliases")
    async def models(self, gateway: Injected[Gateway]) -> ModelList:
        return ModelList(model_cards(gateway))

    @get("/models/{model_id:str}", summary="One served model or alias")
    async def model(self, gateway: Injected[Gateway], model_id: str) -> ModelCard:
        card = next((c for c in model_cards(gateway) if c.id == model_id), None)
        if card is None:
            raise NotFound(f"model {model_id!r} not found", param="model", code="model_not_found")
        return card


def model_cards(gateway: Gateway) -> list[ModelCard]:
    created = int(gateway.started_s)
    names = [*gateway.served_models(), *sorted(gateway.policy.aliases)]
    return [ModelCard(name, created) for name in dict.fromkeys(names)]


def embedding_inputs(raw: Any) -> list[str] | list[list[int]]:
    """A string, strings, token ids, or lists of token ids (OpenAI's four input forms)."""
    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(raw, str):
        raw = [raw]
    if not raw:
        raise BadRequest("input is empty", param="input")
    if len(raw) > MAX_EMBEDDING_INPUTS:
        raise BadRequest(f"at most {MAX_EMBEDDING_INPUTS} inputs per request", param="input")
    if all(isinstance(x, str) for x in raw):
        empty = next((i for i, x in enumerate(raw) if not x), None)
        if empty is not None:  # OpenAI refuses it too: an empty text has no meaning to embed
            raise BadRequest("an input is an empty string", param="input" if len(raw) == 1 else f"input[{empty}]")
        return list(raw)
    if is_ids(raw):
        return [list(raw)]
    if all(is_ids(x) for x in raw):
        return [list(x) for x in raw]
    raise BadRequest("input must be a string, a list of strings, token ids or lists of token ids", param="input")
