"""Ollama-compatible routes under /api: chat and generate (NDJSON streaming), embeddings, and the model
endpoints that apps call first (tags, show, ps, pull, version).

Home Assistant's Ollama integration lists /api/tags, pulls its model with /api/pull and chats with
``tools``; it acts only on ``message.tool_calls`` (arguments as an object), sent here in the line where
a call completes, and sends results back as ``tool`` messages.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any, Literal

from litestar import Controller, Request, Response, get, head, post

from homeai.api.admission import LLMRequest, PromptFields, admit
from homeai.api.embedding_admission import admit_embedding
from homeai.api.errors import ApiError, BadRequest
from homeai.api.generation import AnswerReader, Generation
from homeai.api.model_info import model_details, model_ps, model_show, model_tags, pull_lines
from homeai.api.ollama_schemas import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ModelRequest,
    Options,
)
from homeai.api.routing import request_context, resident, route_request
from homeai.api.services import Injected
from homeai.api.streaming import ndjson_line, ndjson_stream
from homeai.api.structured import ollama_format_constraint
from homeai.api.tool_calls import ToolCall, parse_all
from homeai.api.tools import assistant_calls_message, earlier_calls, parse_tools, tool_result_message
from homeai.core.types import FinishReason, SamplingParams
from homeai.gateway.gateway import Gateway
from homeai.policy.durations import parse_keep_alive

OLLAMA_API_VERSION = "0.6.0"  # the Ollama API version whose endpoints and fields we follow


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def sampling_params(options: Options | None) -> SamplingParams:
    """Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 over the last 64 tokens,
    a random seed) for what is unset; max_tokens is settled by admission."""
    o = options or Options()
    return SamplingParams(
        temperature=0.8 if o.temperature is None else o.temperature,
        top_k=40 if o.top_k is None else int(o.top_k), top_p=0.9 if o.top_p is None else o.top_p,
        min_p=o.min_p or 0.0, repetition_penalty=1.1 if o.repeat_penalty is None else o.repeat_penalty,
        repeat_last_n=64 if o.repeat_last_n is None else int(o.repeat_last_n),
        presence_penalty=o.presence_penalty or 0.0, frequency_penalty=o.frequency_penalty or 0.0,
        seed=None if o.seed is None or o.seed < 0 else int(o.seed),  # below 0: Ollama's "random"
        max_tokens=1, stop=[s for s in o.stop or [] if s])


def requested_max_tokens(options: Options | None) -> int | None:
    n = options.num_predict if options else None
    return int(n) if n is not None and n > 0 else None  # -1 / -2 / 0: as much as the context allows


def num_ctx_of(options: Options | None) -> int | None:
    return int(options.num_ctx) if options and options.num_ctx is not None else None


def keep_alive_of(data: ChatRequest | GenerateRequest) -> float | None | Literal["policy"]:
    return parse_keep_alive(data.keep_alive) if data.keep_alive is not None else "policy"


def chat_request(data: ChatRequest) -> LLMRequest:
    """The adapter for /api/chat. Ollama has no tool_choice: auto, unless the class says required (policy
    ``tool_choice``)."""
    if any(m.images for m in data.messages):
        raise BadRequest(f"model {data.model!r} does not take images", param="messages")
    messages: list[dict[str, Any]] = []
    for m in data.messages:
        if m.role == "tool":
            messages.append(tool_result_message(m.content))
        elif m.role == "assistant" and m.tool_calls:
            messages.append(assistant_calls_message(m.content, earlier_calls(m.tool_calls)))
        else:
            messages.append({"role": m.role, "content": m.content})
    return LLMRequest(
        data.model, "chat", sampling_params(data.options), requested_max_tokens(data.options), messages=messages,
        tools=parse_tools(data.tools), answer_format=ollama_format_constraint(data.format),
        user_spoke_last=data.messages[-1].role == "user", keep_alive_s=keep_alive_of(data),
        num_ctx=num_ctx_of(data.options), fields=PromptFields("messages", "options.num_predict"))


def generate_request(data: GenerateRequest) -> LLMRequest:
    """The adapter for /api/generate: the prompt through the chat template (with ``system``), or as it is
    (``raw``), after the token ids of an earlier answer (``context``)."""
    if data.images:
        raise BadRequest(f"model {data.model!r} does not take images", param="images")
    req = LLMRequest(data.model, "completion", sampling_params(data.options), requested_max_tokens(data.options),
                     context_ids=list(data.context or []), answer_format=ollama_format_constraint(data.format),
                     keep_alive_s=keep_alive_of(data), num_ctx=num_ctx_of(data.options),
                     fields=PromptFields("prompt", "options.num_predict"))
    if data.raw:
        req.text = data.prompt
    else:
        system = [{"role": "system", "content": data.system}] if data.system else []
        req.messages = [*system, {"role": "user", "content": data.prompt}]
    return req


class _Timing:
    """Ollama reports durations in nanoseconds: total, prompt evaluation (to the first token), generation."""

    def __init__(self) -> None:
        self.start_ns = time.monotonic_ns()
        self.first_ns = self.start_ns

    def final(self, gen: Generation, reason: FinishReason | None) -> dict[str, Any]:
        end = time.monotonic_ns()
        return {"done": True, "done_reason": "length" if reason == FinishReason.LENGTH else "stop",
                "total_duration": end - self.start_ns, "load_duration": 0,
                "prompt_eval_count": len(gen.prompt_ids), "prompt_eval_duration": self.first_ns - self.start_ns,
                "eval_count": gen.num_output_tokens, "eval_duration": end - self.first_ns}


def wire_call(call: ToolCall) -> dict[str, Any]:
    return {"function": {"name": call.name, "arguments": call.arguments_object()}}


async def reply(request: Request[Any, Any, Any], gateway: Gateway, req: LLMRequest, stream: bool) -> Response[Any]:
    """Admit the request and answer as NDJSON lines (stream) or one JSON object, tool calls read out of
    the answer when it may call tools (Ollama sends a call in the line where it completes)."""
    timing = _Timing()
    admitted = await admit(request, gateway, req)
    timing.first_ns = time.monotonic_ns()
    gen, chat = admitted.generation, req.messages is not None and req.kind == "chat"

    def line(text: str, calls: list[ToolCall] | None = None) -> dict[str, Any]:
        body = {"model": req.model, "created_at": now_iso()}
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [wire_call(c) for c in calls]
            return {**body, "message": message}
        return {**body, "response": text}

    def final(reason: FinishReason | None) -> dict[str, Any]:
        """The last line's counts; /api/generate's (not raw) also its ``context``: the conversation's token ids,
        which the client sends back as ``context`` to go on from there, as Ollama's clients do."""
        body = timing.final(gen, reason)
        if not chat and req.text is None:
            body["context"] = [*gen.prompt_ids, *gen.output_ids]
        return body

    if not stream:
        text, reason = await gen.collect()
        content, calls = parse_all(text) if admitted.reads_calls else (text, [])
        return Response({**line(content, calls), **final(reason)})

    async def lines() -> AsyncGenerator[bytes, None]:
        async with aclosing(AnswerReader(gen, admitted.reads_calls).steps()) as steps:
            async for step in steps:
                if step.error:
                    yield ndjson_line({"error": step.error})
                    return
                for e in step.events:
                    if e.text:
                        yield ndjson_line({**line(e.text), "done": False})
                    elif e.done and e.call is not None:  # Ollama sends a call once it is whole
                        yield ndjson_line({**line("", [e.call]), "done": False})
                if step.finished:
                    yield ndjson_line({**line(""), **final(step.finish_reason)})

    return ndjson_stream(lines())


async def load_or_unload(request: Request[Any, Any, Any], gateway: Gateway, data: ChatRequest | GenerateRequest,
                         chat: bool) -> dict[str, Any]:
    """What Ollama does with a request without a prompt: loads the model, or unloads it when ``keep_alive``
    is 0 (a pinned model stays: it says "load")."""
    unload = data.keep_alive is not None and parse_keep_alive(data.keep_alive) == 0
    ctx = await request_context(request)
    route = route_request(gateway, data.model, ctx, "llm")
    reason = "load"
    if unload and not gateway.policy.model_policy(route.model).pinned:
        gateway.keep_alive(route.model, 0, unload_now=True)
        reason = "unload"
    else:
        await resident(gateway, route, ctx, keep_alive_of(data))
    body: dict[str, Any] = {"model": data.model, "created_at": now_iso(), "done": True, "done_reason": reason}
    return {**body, "message": {"role": "assistant", "content": ""}} if chat else {**body, "response": ""}


class OllamaController(Controller):
    path = "/api"
    tags = ["ollama"]

    @post("/chat", status_code=200, summary="Chat (NDJSON lines unless stream is false)")
    async def chat(self, request: Request[Any, Any, Any], data: ChatRequest,
                   gateway: Injected[Gateway]) -> Response[Any]:
        if not data.messages:
            return Response(await load_or_unload(request, gateway, data, chat=True))
        return await reply(request, gateway, chat_request(data), data.stream)

    @post("/generate", status_code=200, summary="Completion of a prompt (NDJSON lines unless stream is false)")
    async def generate(self, request: Request[Any, Any, Any], data: GenerateRequest,
                       gateway: Injected[Gateway]) -> Response[Any]:
        if data.suffix:  # as Ollama answers for a model without fill-in-the-middle
            raise BadRequest(f"suffix: {data.model} does not support insert", param="suffix")
        if data.template:  # the model's own chat template is the only one served; never dropped silently
            raise BadRequest("template: only the model's own template is served", param="template")
        if not data.prompt and not data.context:
            return Response(await load_or_unload(request, gateway, data, chat=False))
        return await reply(request, gateway, generate_request(data), data.stream)

    @post("/embed", status_code=200, summary="Embeddings of one or more texts")
    async def embed(self, request: Request[Any, Any, Any], data: EmbedRequest,
                    gateway: Injected[Gateway]) -> dict[str, Any]:
        started_ns = time.monotonic_ns()
        inputs = ([data.input] if data.input else []) if isinstance(data.input, str) else list(data.input)
        if not inputs:  # as Ollama: no vectors, once the model is known
            route_request(gateway, data.model, await request_context(request), "embedding")
            return {"model": data.model, "embeddings": []}
        # Ollama's truncate: the default (true) cuts a long input, false refuses it
        _, result = await admit_embedding(request, gateway, data.model, inputs, cut_long=data.truncate,
                                          dimensions=data.dimensions,
                                          num_ctx=num_ctx_of(data.options))
        return {"model": data.model, "embeddings": result.vectors.tolist(), "load_duration": 0,
                "total_duration": time.monotonic_ns() - started_ns, "prompt_eval_count": result.num_tokens}

    @post("/embeddings", status_code=200, summary="Embedding of one text (legacy endpoint)")
    async def embeddings(self, request: Request[Any, Any, Any], data: EmbeddingsRequest,
                         gateway: Injected[Gateway]) -> dict[str, Any]:
        if not data.prompt:
            route_request(gateway, data.model, await request_context(request), "embedding")  # 404/400 all the same
            return {"embedding": []}
        _, result = await admit_embedding(request, gateway, data.model, [data.prompt], cut_long=True)
        return {"embedding": result.vectors[0].tolist()}

    @get("/tags", summary="Models that can be used")
    async def list_tags(self, gateway: Injected[Gateway]) -> dict[str, Any]:
        return {"models": model_tags(gateway)}

    @get("/ps", summary="Models loaded now, and when each expires (its keep_alive)")
    async def ps(self, gateway: Injected[Gateway]) -> dict[str, Any]:
        return {"models": model_ps(gateway)}

    @get("/version", summary="The Ollama API version we follow")
    async def version(self) -> dict[str, str]:
        return {"version": OLLAMA_API_VERSION}

    @post("/show", status_code=200, summary="A model's details, template and capabilities")
    async def show(self, data: ModelRequest, gateway: Injected[Gateway]) -> dict[str, Any]:
        return model_show(gateway, data.model_name)

    @post("/pull", status_code=200, summary="Fetch a model from the model repository (progress as NDJSON)",
          opt={"auth": "admin"})  # downloads gigabytes into the server's cache: admin only
    async def pull(self, data: ModelRequest, gateway: Injected[Gateway]) -> Response[Any]:
        model_details(gateway, data.model_name)  # 404 before any line is sent
        if not data.stream:
            async for line in pull_lines(gateway, data.model_name):
                if "error" in line:
                    raise ApiError(line["error"], status_code=500, code="pull_failed")
            return Response({"status": "success"})
        return ndjson_stream(ndjson_line(line) async for line in pull_lines(gateway, data.model_name))


@get("/", include_in_schema=False, media_type="text/plain", opt={"auth": "public"})
async def ollama_root() -> str:
    """Ollama answers its root with this sentence, and some clients probe for it."""
    return "Ollama is running"


@head("/", include_in_schema=False, opt={"auth": "public"})
async def ollama_root_head() -> None:
    """Ollama's clients probe the server with HEAD / before anything else."""

