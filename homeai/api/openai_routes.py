"""OpenAI-compatible routes: chat and text completions, embeddings, models.

A household app changes only its base URL to ``http://<server>:8000/v1``. Streaming follows OpenAI's
SSE format (``chat.completion.chunk`` objects, an optional final usage chunk, ``data: [DONE]``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.openapi.datastructures import ResponseSpec

from homeai.api.embedding_limits import check_input_lengths
from homeai.api.errors import BadRequest, NotFound
from homeai.api.logprobs import chat_logprobs, completion_logprobs
from homeai.api.openai_chat import chat_logprobs_wanted, chat_message, chat_shape, message_dicts
from homeai.api.openai_schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    EmbeddingData,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    ErrorBody,
    ModelCard,
    ModelList,
    Usage,
)
from homeai.api.serving import (
    Generation,
    chat_prompt_ids,
    check_prompt_fits,
    check_token_ids,
    class_tool_choice_of,
    constrain,
    default_max_tokens,
    gateway_of,
    request_context,
    resident,
    route_request,
    run_embedding,
    text_prompt_ids,
)
from homeai.api.streaming import SSE_DONE, sse_data, sse_stream
from homeai.api.tool_calls import ToolCallParser
from homeai.core.types import Constraint, FinishReason, SamplingParams, TokenDelta, TokenLogprob
from homeai.engine.gateway import Gateway, Route

MAX_EMBEDDING_INPUTS = 2048


def documented(body: type, what: str) -> dict[int, ResponseSpec]:
    """OpenAPI responses: the 200 body (SSE when streaming) and our error shape for each status we send."""
    errors = {400: "invalid request (names the field)", 404: "unknown model", 413: "body too large",
              429: "class queue full (Retry-After)", 503: "queue timeout or engine starting (Retry-After)"}
    return {200: ResponseSpec(body, description=what),
            **{code: ResponseSpec(ErrorBody, description=text) for code, text in errors.items()}}


def sampling_params(data: Any, max_tokens: int) -> SamplingParams:
    """OpenAI defaults (temperature 1, top_p 1) for whatever the request leaves out."""
    stop = [data.stop] if isinstance(data.stop, str) else list(data.stop or [])
    return SamplingParams(
        temperature=1.0 if data.temperature is None else data.temperature,
        top_p=1.0 if data.top_p is None else data.top_p, top_k=data.top_k or 0, min_p=data.min_p or 0.0,
        presence_penalty=data.presence_penalty or 0.0, frequency_penalty=data.frequency_penalty or 0.0,
        repetition_penalty=data.repetition_penalty or 1.0, seed=data.seed, max_tokens=max_tokens,
        stop=[s for s in stop if s], ignore_eos=data.ignore_eos)


def finish_reason(reason: FinishReason | None, calls: bool = False) -> str:
    if reason == FinishReason.LENGTH:
        return "length"
    return "tool_calls" if calls else "stop"


def usage(gen: Generation) -> Usage:
    n_in, n_out = len(gen.prompt_ids), gen.num_output_tokens
    return Usage(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out)


async def start(request: Request[Any, Any, Any], data: Any, kind: str, max_tokens: int | None,
                prompt: Any, constraint: Callable[[], tuple[Constraint, str] | None] | None = None,
                logprobs: int | None = None, fields: tuple[str, str] = ("messages", "max_tokens")) -> Generation:
    """Route, tokenize, queue; returns once the first token is out (or raises the HTTP error).
    ``constraint``: the output's grammar and the request field it came from (named by a 400), asked
    for once ``prompt`` has run (a class may decide it). ``fields``: the request's names of the prompt and
    of its output limit, which a 400 about their length names."""
    if data.n != 1:
        raise BadRequest("only n=1 is supported", param="n")
    ctx = await request_context(request, data.user)
    gateway = gateway_of(request)
    route = route_request(gateway, data.model, ctx, "llm")
    await resident(gateway, route, ctx)
    prompt_ids = await prompt(gateway, route)
    params = sampling_params(data, default_max_tokens(gateway, route, prompt_ids, max_tokens))
    check_prompt_fits(gateway, route, prompt_ids, params.max_tokens, *fields)
    params.logprobs = logprobs
    sourced = constraint() if constraint is not None else None
    fits = True
    if sourced is not None:
        if params.ignore_eos:  # a finished grammar allows only the end: ignoring it leaves no token
            raise BadRequest(f"ignore_eos cannot be combined with {sourced[1]}", param="ignore_eos")
        fits = await constrain(gateway, route, prompt_ids, params, sourced)
    gen = Generation(request, route, prompt_ids, params, ctx, kind, fits)
    await gen.open()
    return gen


async def stream_chunks(gen: Generation, obj: str, include_usage: bool, prefix: str = "",
                        tools: bool = False) -> AsyncGenerator[bytes, None]:
    """SSE for chat (``delta``) or text completions (``text``); closing it aborts the request.
    With ``tools``, calls stream as OpenAI streams them (index, id and name, then the arguments), each
    once it is complete: a call the budget cuts short never goes out (``ToolCallParser``)."""
    created, rid = int(time.time()), ("chatcmpl-" if obj.startswith("chat") else "cmpl-") + gen.request_id
    is_chat = obj.startswith("chat")
    tokenizer = gen.gateway.llm(gen.route.model).tokenizer
    parser = ToolCallParser() if tools else None
    offset = len(prefix)

    def chunk(choice: dict[str, Any] | None, **extra: Any) -> bytes:
        body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": gen.route.model,
                                "choices": [choice] if choice is not None else [], **extra}
        if include_usage and "usage" not in extra:
            body["usage"] = None
        return sse_data(body)

    def piece(delta: dict[str, Any], reason: str | None = None, logprobs: list[TokenLogprob] | None = None,
              text: str = "") -> bytes:
        nonlocal offset
        if is_chat:
            lp = chat_logprobs(logprobs, tokenizer) if logprobs else None
            return chunk({"index": 0, "delta": delta, "finish_reason": reason, "logprobs": lp})
        lp = completion_logprobs(logprobs, tokenizer, offset) if logprobs else None
        offset += len(text)
        return chunk({"index": 0, "text": text, "finish_reason": reason, "logprobs": lp})

    def events(delta: TokenDelta) -> list[dict[str, Any]]:
        """The chat deltas for this token delta's text (through the tool-call parser, if any)."""
        if parser is None:
            return [{"content": delta.text}] if delta.text else []
        out: list[dict[str, Any]] = []
        for e in parser.feed(delta.text) + (parser.finish() if delta.finished else []):
            if e.text:
                out.append({"content": e.text})
            elif e.call is not None and e.fragment:
                out.append({"tool_calls": [{"index": e.call.index, "function": {"arguments": e.fragment}}]})
            elif e.call is not None and not e.done:
                out.append({"tool_calls": [{"index": e.call.index, "id": e.call.id, "type": "function",
                                            "function": {"name": e.call.name, "arguments": ""}}]})
        return out

    if is_chat:
        yield piece({"role": "assistant", "content": ""})
    elif prefix:
        yield piece({}, text=prefix)
    async with aclosing(gen.deltas()) as deltas:
        async for delta in deltas:
            if delta.error:  # an engine error, or a drain at shutdown: an error event, then the usual end
                yield sse_data({"error": {"message": delta.error, "type": "server_error", "param": None,
                                          "code": "engine_error"}})
                yield SSE_DONE
                return
            logprobs = delta.logprobs or None
            if is_chat:
                for body in events(delta):
                    yield piece(body, logprobs=logprobs)
                    logprobs = None  # a delta's logprobs ride on its first chunk
                if logprobs:
                    yield piece({}, logprobs=logprobs)
            elif delta.text or logprobs:
                yield piece({}, logprobs=logprobs, text=delta.text)
            if delta.finished:
                calls = bool(parser and parser.calls)
                yield piece({}, finish_reason(delta.finish_reason, calls))
    if include_usage:
        yield chunk(None, usage=usage(gen))
    yield SSE_DONE


class OpenAIController(Controller):
    """/v1: what the ``openai`` package and OpenAI-speaking apps call."""

    path = "/v1"
    tags = ["openai"]

    @post("/chat/completions", status_code=200, summary="Chat completion (SSE when stream is true)",
          responses=documented(ChatCompletion, "the completion; with stream, SSE chunks and data: [DONE]"))
    async def chat_completions(self, request: Request[Any, Any, Any], data: ChatCompletionRequest) -> Response[Any]:
        messages = message_dicts(data.messages)
        logprobs = chat_logprobs_wanted(data)
        shape = chat_shape(data, "auto")  # a 400 before anything else; the class may change it

        async def prompt(gateway: Gateway, route: Route) -> list[int]:
            nonlocal shape
            shape = chat_shape(data, class_tool_choice_of(gateway, route))
            plan = shape.plan
            return await chat_prompt_ids(gateway, route.model, messages, plan.tools if plan.active else None)

        limit = "max_completion_tokens" if data.max_completion_tokens else "max_tokens"
        gen = await start(request, data, "chat", data.max_completion_tokens or data.max_tokens, prompt,
                          lambda: shape.constraint, logprobs, ("messages", limit))
        plan = shape.plan
        if data.stream:
            include = bool(data.stream_options and data.stream_options.include_usage)
            return sse_stream(stream_chunks(gen, "chat.completion.chunk", include, tools=plan.active))
        text, reason = await gen.collect()
        message, called = chat_message(text, plan.active)
        lp = chat_logprobs(gen.logprobs, gen.gateway.llm(gen.route.model).tokenizer) if logprobs is not None else None
        choice = ChatChoice(0, message, finish_reason(reason, called), lp)
        return Response(ChatCompletion("chatcmpl-" + gen.request_id, int(time.time()), gen.route.model,
                                       [choice], usage(gen)))

    @post("/completions", status_code=200, summary="Text completion (SSE when stream is true)",
          responses=documented(Completion, "the completion; with stream, SSE chunks and data: [DONE]"))
    async def completions(self, request: Request[Any, Any, Any], data: CompletionRequest) -> Response[Any]:
        async def prompt(gateway: Gateway, route: Route) -> list[int]:
            raw = data.prompt
            if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
                raw = raw[0]  # one prompt in a list
            if isinstance(raw, str):
                return await text_prompt_ids(gateway, route.model, raw)
            if raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
                check_token_ids(raw, len(gateway.llm(route.model).tokenizer), "prompt")
                return list(raw)
            raise BadRequest("prompt must be a string or a list of token ids (one prompt: n=1)", param="prompt")

        gen = await start(request, data, "completion", data.max_tokens, prompt, logprobs=data.logprobs,
                          fields=("prompt", "max_tokens"))
        echo = data.prompt if data.echo and isinstance(data.prompt, str) else ""
        if data.stream:
            include = bool(data.stream_options and data.stream_options.include_usage)
            return sse_stream(stream_chunks(gen, "text_completion", include, prefix=echo))
        text, reason = await gen.collect()
        tokenizer = gen.gateway.llm(gen.route.model).tokenizer
        lp = completion_logprobs(gen.logprobs, tokenizer, len(echo)) if data.logprobs is not None else None
        choice = CompletionChoice(0, echo + text, finish_reason(reason), lp)
        return Response(Completion("cmpl-" + gen.request_id, int(time.time()), gen.route.model, [choice],
                                   usage(gen)))

    @post("/embeddings", status_code=200, summary="Embeddings of strings or token arrays",
          responses=documented(EmbeddingList, "one vector per input (floats or base64 little-endian float32)"))
    async def embeddings(self, request: Request[Any, Any, Any], data: EmbeddingRequest) -> EmbeddingList:
        inputs = embedding_inputs(data.input)
        ctx = await request_context(request, data.user)
        gateway = gateway_of(request)
        route = route_request(gateway, data.model, ctx, "embedding")
        dim = gateway.embedders[route.model].dim
        if data.dimensions is not None and data.dimensions != dim:
            raise BadRequest(f"model {route.model!r} gives {dim} dimensions", param="dimensions")
        await check_input_lengths(gateway.embedders[route.model], route.model, inputs)  # OpenAI refuses, never cuts
        result = await run_embedding(request, route, inputs, ctx)
        vectors = result.vectors.astype("<f4")
        items = [EmbeddingData(i, base64.b64encode(v.tobytes()).decode() if data.encoding_format == "base64"
                               else v.tolist()) for i, v in enumerate(vectors)]
        return EmbeddingList(items, route.model, EmbeddingUsage(result.num_tokens, result.num_tokens))

    @get("/models", summary="Served models and the policy's model aliases")
    async def models(self, request: Request[Any, Any, Any]) -> ModelList:
        return ModelList(model_cards(gateway_of(request)))

    @get("/models/{model_id:str}", summary="One served model or alias")
    async def model(self, request: Request[Any, Any, Any], model_id: str) -> ModelCard:
        card = next((c for c in model_cards(gateway_of(request)) if c.id == model_id), None)
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
        return [raw]
    if not raw:
        raise BadRequest("input is empty", param="input")
    if len(raw) > MAX_EMBEDDING_INPUTS:
        raise BadRequest(f"at most {MAX_EMBEDDING_INPUTS} inputs per request", param="input")
    if all(isinstance(x, str) for x in raw):
        return list(raw)
    if is_ids(raw):
        return [list(raw)]
    if all(is_ids(x) for x in raw):
        return [list(x) for x in raw]
    raise BadRequest("input must be a string, a list of strings, token ids or lists of token ids", param="input")
