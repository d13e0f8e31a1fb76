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
from typing import Any

from litestar import Controller, Request, Response, get, head, post

from homeai.api.embedding_limits import check_input_lengths
from homeai.api.errors import ApiError, BadRequest
from homeai.api.model_info import model_details, model_ps, model_show, model_tags, pull_lines
from homeai.api.ollama_schemas import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ModelRequest,
    Options,
)
from homeai.api.serving import (
    Generation,
    RequestContext,
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
from homeai.api.streaming import ndjson_line, ndjson_stream
from homeai.api.structured import ollama_format_constraint
from homeai.api.tool_calls import ToolCall, ToolCallParser, parse_all
from homeai.api.tools import answer_shape, assistant_calls_message, tool_result_message
from homeai.core.types import Constraint, FinishReason, SamplingParams
from homeai.engine.gateway import Gateway, Route
from homeai.policy.durations import parse_keep_alive

OLLAMA_API_VERSION = "0.6.0"  # the Ollama API version whose endpoints and fields we follow


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def sampling_params(options: Options | None, max_tokens: int) -> SamplingParams:
    """Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1) for what is unset."""
    o = options or Options()
    return SamplingParams(
        temperature=0.8 if o.temperature is None else o.temperature, top_k=40 if o.top_k is None else o.top_k,
        top_p=0.9 if o.top_p is None else o.top_p, min_p=o.min_p or 0.0,
        repetition_penalty=1.1 if o.repeat_penalty is None else o.repeat_penalty,
        presence_penalty=o.presence_penalty or 0.0, frequency_penalty=o.frequency_penalty or 0.0,
        seed=o.seed, max_tokens=max_tokens, stop=[s for s in o.stop or [] if s])


async def routed(request: Request[Any, Any, Any], data: ChatRequest | GenerateRequest | EmbedRequest |
                 EmbeddingsRequest, kind: str, load: bool = True) -> tuple[RequestContext, Gateway, Route]:
    """Who asks, the gateway and the route, with an LLM on the device (``load``; it stays for the request's
    ``keep_alive`` after it); ``options.num_ctx`` above the model's context is a 400 (a smaller one is
    served in the model's own context)."""
    ctx = await request_context(request)
    gateway = gateway_of(request)
    route = route_request(gateway, data.model, ctx, kind)
    if kind == "llm" and load:
        await resident(gateway, route, ctx, parse_keep_alive(data.keep_alive) if data.keep_alive is not None
                       else "policy")
    num_ctx = data.options.num_ctx if data.options is not None else None
    if num_ctx is not None:
        limit = gateway.llm(route.model).max_model_len if kind == "llm" else gateway.embedders[route.model].max_length
        if num_ctx > limit:
            raise BadRequest(f"options.num_ctx is {num_ctx}; model {route.model!r} holds at most {limit} tokens",
                             param="options.num_ctx")
    return ctx, gateway, route


def requested_max_tokens(options: Options | None) -> int | None:
    n = options.num_predict if options else None
    return n if n is not None and n > 0 else None  # -1 / -2 / 0: as much as the context allows


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


def ollama_messages(data: ChatRequest) -> list[dict[str, Any]]:
    """Chat-template messages: tool results and earlier calls written as the model reads them."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(data.messages):
        if m.role == "tool":
            out.append(tool_result_message(m.content))
        elif m.role == "assistant" and m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest("a tool call needs function.name", param=f"messages[{i}].tool_calls[{j}]")
                calls.append((fn["name"], fn.get("arguments") or {}))
            out.append(assistant_calls_message(m.content, calls))
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def wire_call(call: ToolCall) -> dict[str, Any]:
    return {"function": {"name": call.name, "arguments": call.arguments_object()}}


async def generate_reply(request: Request[Any, Any, Any], data: ChatRequest | GenerateRequest,
                         prompt_ids: list[int], route: Any, ctx: Any, chat: bool,
                         constraint: tuple[Constraint, str] | None = None, tools: bool = False) -> Response[Any]:
    """Run one generation and answer as NDJSON lines (stream) or one JSON object. ``constraint``: the
    answer's grammar and the field it came from; ``tools``: read calls out of the answer."""
    timing = _Timing()
    gateway = gateway_of(request)
    params = sampling_params(data.options, default_max_tokens(gateway, route, prompt_ids,
                                                              requested_max_tokens(data.options)))
    check_prompt_fits(gateway, route, prompt_ids, params.max_tokens, "messages" if chat else "prompt",
                      "options.num_predict")
    fits = await constrain(gateway, route, prompt_ids, params, constraint) if constraint is not None else True
    gen = Generation(request, route, prompt_ids, params, ctx, "chat" if chat else "completion", fits)
    await gen.open()
    timing.first_ns = time.monotonic_ns()

    def line(text: str, calls: list[ToolCall] | None = None) -> dict[str, Any]:
        body = {"model": data.model, "created_at": now_iso()}
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [wire_call(c) for c in calls]
            return {**body, "message": message}
        return {**body, "response": text}

    if not data.stream:
        text, reason = await gen.collect()
        content, calls = parse_all(text) if tools else (text, [])
        return Response({**line(content, calls), **timing.final(gen, reason)})

    parser = ToolCallParser() if tools else None

    async def lines() -> AsyncGenerator[bytes, None]:
        async with aclosing(gen.deltas()) as deltas:
            async for delta in deltas:
                if delta.error:
                    yield ndjson_line({"error": delta.error})
                    return
                if parser is None:
                    if delta.text:
                        yield ndjson_line({**line(delta.text), "done": False})
                else:
                    for e in parser.feed(delta.text) + (parser.finish() if delta.finished else []):
                        if e.text:
                            yield ndjson_line({**line(e.text), "done": False})
                        elif e.done and e.call is not None:  # Ollama sends a call once it is whole
                            yield ndjson_line({**line("", [e.call]), "done": False})
                if delta.finished:
                    yield ndjson_line({**line(""), **timing.final(gen, delta.finish_reason)})

    return ndjson_stream(lines())


async def load_or_unload(request: Request[Any, Any, Any], data: ChatRequest | GenerateRequest,
                         chat: bool) -> dict[str, Any]:
    """What Ollama does with a request without a prompt: loads the model, or unloads it when ``keep_alive``
    is 0 (a pinned model stays: it says "load")."""
    unload = data.keep_alive is not None and parse_keep_alive(data.keep_alive) == 0
    ctx, gateway, route = await routed(request, data, "llm", load=not unload)
    reason = "load"
    if unload and not gateway.policy.model_policy(route.model).pinned:
        gateway.keep_alive(route.model, 0, unload_now=True)
        reason = "unload"
    body: dict[str, Any] = {"model": data.model, "created_at": now_iso(), "done": True, "done_reason": reason}
    return {**body, "message": {"role": "assistant", "content": ""}} if chat else {**body, "response": ""}


class OllamaController(Controller):
    path = "/api"
    tags = ["ollama"]

    @post("/chat", status_code=200, summary="Chat (NDJSON lines unless stream is false)")
    async def chat(self, request: Request[Any, Any, Any], data: ChatRequest) -> Response[Any]:
        if not data.messages:
            return Response(await load_or_unload(request, data, chat=True))
        ctx, gateway, route = await routed(request, data, "llm")
        if any(m.images for m in data.messages):
            raise BadRequest(f"model {route.model!r} does not take images")
        messages = ollama_messages(data)
        # Ollama has no tool_choice: auto, unless the class says required (policy tool_choice)
        shape = answer_shape(data.tools, None, None, ollama_format_constraint(data.format),
                             class_tool_choice_of(gateway, route), data.messages[-1].role == "user")
        plan = shape.plan
        prompt_ids = await chat_prompt_ids(gateway, route.model, messages, plan.tools if plan.active else None)
        return await generate_reply(request, data, prompt_ids, route, ctx, chat=True, constraint=shape.constraint,
                                    tools=plan.active)

    @post("/generate", status_code=200, summary="Completion of a prompt (NDJSON lines unless stream is false)")
    async def generate(self, request: Request[Any, Any, Any], data: GenerateRequest) -> Response[Any]:
        if not data.prompt and not data.context:
            return Response(await load_or_unload(request, data, chat=False))
        ctx, gateway, route = await routed(request, data, "llm")
        if data.images:
            raise BadRequest(f"model {route.model!r} does not take images")
        if data.raw:
            prompt_ids = await text_prompt_ids(gateway, route.model, data.prompt)
        else:
            messages = [{"role": "system", "content": data.system}] if data.system else []
            prompt_ids = await chat_prompt_ids(gateway, route.model, [*messages, {"role": "user",
                                                                                    "content": data.prompt}])
        if data.context:
            check_token_ids(data.context, len(gateway.llm(route.model).tokenizer), "context")
            prompt_ids = [*data.context, *prompt_ids]
        return await generate_reply(request, data, prompt_ids, route, ctx, chat=False,
                                    constraint=ollama_format_constraint(data.format))

    @post("/embed", status_code=200, summary="Embeddings of one or more texts")
    async def embed(self, request: Request[Any, Any, Any], data: EmbedRequest) -> dict[str, Any]:
        started_ns = time.monotonic_ns()
        inputs = [data.input] if isinstance(data.input, str) else list(data.input)
        if not inputs:
            raise BadRequest("input is empty")
        ctx, gateway, route = await routed(request, data, "embedding")
        if data.dimensions is not None and data.dimensions != gateway.embedders[route.model].dim:
            raise BadRequest(f"model {route.model!r} gives {gateway.embedders[route.model].dim} dimensions")
        if not data.truncate:  # Ollama's option: the default (true) cuts a long input, false refuses it
            await check_input_lengths(gateway.embedders[route.model], route.model, inputs)
        result = await run_embedding(request, route, inputs, ctx)
        return {"model": data.model, "embeddings": result.vectors.tolist(), "load_duration": 0,
                "total_duration": time.monotonic_ns() - started_ns, "prompt_eval_count": result.num_tokens}

    @post("/embeddings", status_code=200, summary="Embedding of one text (legacy endpoint)")
    async def embeddings(self, request: Request[Any, Any, Any], data: EmbeddingsRequest) -> dict[str, Any]:
        ctx, _, route = await routed(request, data, "embedding")
        if not data.prompt:
            return {"embedding": []}
        result = await run_embedding(request, route, [data.prompt], ctx)
        return {"embedding": result.vectors[0].tolist()}

    @get("/tags", summary="Models that can be used")
    async def list_tags(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        return {"models": model_tags(gateway_of(request))}

    @get("/ps", summary="Models loaded now, and when each expires (its keep_alive)")
    async def ps(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        return {"models": model_ps(gateway_of(request))}

    @get("/version", summary="The Ollama API version we follow")
    async def version(self) -> dict[str, str]:
        return {"version": OLLAMA_API_VERSION}

    @post("/show", status_code=200, summary="A model's details, template and capabilities")
    async def show(self, request: Request[Any, Any, Any], data: ModelRequest) -> dict[str, Any]:
        return model_show(gateway_of(request), data.model_name)

    @post("/pull", status_code=200, summary="Fetch a model from the model repository (progress as NDJSON)",
          opt={"auth": "admin"})  # downloads gigabytes into the server's cache: admin only
    async def pull(self, request: Request[Any, Any, Any], data: ModelRequest) -> Response[Any]:
        gateway = gateway_of(request)
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

