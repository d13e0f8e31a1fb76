"""POST /v1/responses: OpenAI's Responses API, which Home Assistant's OpenAI integration speaks.

Stateless: ``previous_response_id`` and ``store`` are accepted, nothing is stored, and each call sends
its whole conversation as ``input``. Tools are accepted and never called: the answer is plain text.
Streaming sends the typed events (``response.created`` ... ``response.completed``) the SDK expects.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from litestar import Controller, Request, Response, post

from homeai.api.errors import BadRequest
from homeai.api.openai_routes import start
from homeai.api.openai_schemas import ResponsesRequest
from homeai.api.serving import Generation, chat_prompt_ids
from homeai.api.streaming import sse_data, sse_stream
from homeai.core.types import FinishReason
from homeai.engine.gateway import Gateway, Route

_ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


def _item_text(content: Any, field: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest("content must be a string or a list of parts", param=field)
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise BadRequest("only text parts are supported", param=f"{field}[{i}]")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(data: ResponsesRequest) -> list[dict[str, str]]:
    """``instructions`` + ``input`` as chat-template messages; tool calls and results become text."""
    messages = [{"role": "system", "content": data.instructions}] if data.instructions else []
    if isinstance(data.input, str):
        return [*messages, {"role": "user", "content": data.input}]
    for i, item in enumerate(data.input):
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in _ROLES:
            text = _item_text(item.get("content", ""), f"input[{i}].content")
            messages.append({"role": _ROLES[item["role"]], "content": text})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": f"[called {item.get('name')}({item.get('arguments')})]"})
        elif kind == "function_call_output":
            messages.append({"role": "user", "content": f"[tool result] {item.get('output', '')}"})
        elif kind == "message":
            raise BadRequest(f"unknown role {item.get('role')!r}", param=f"input[{i}].role")
        # other items (reasoning, web search calls...) carry nothing our models can use
    if not any(m["role"] == "user" for m in messages):
        raise BadRequest("input has no user message", param="input")
    return messages


class _Reply:
    """Builds the response object and its output message as the SDK parses them."""

    def __init__(self, gen: Generation, data: ResponsesRequest) -> None:
        self.gen, self.data = gen, data
        self.id, self.message_id = "resp_" + gen.request_id, "msg_" + gen.request_id
        self.created_at = int(time.time())

    def message(self, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        content = [] if status == "in_progress" else [part]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def body(self, text: str | None, reason: FinishReason | None) -> dict[str, Any]:
        incomplete = reason == FinishReason.LENGTH
        status = "in_progress" if text is None else "incomplete" if incomplete else "completed"
        n_in, n_out = len(self.gen.prompt_ids), self.gen.num_output_tokens
        data = self.data
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.gen.route.model, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete and text is not None else None,
            "instructions": data.instructions, "metadata": data.metadata or {},
            "output": [] if text is None else [self.message(text, "incomplete" if incomplete else "completed")],
            "parallel_tool_calls": bool(data.parallel_tool_calls), "tool_choice": "auto", "tools": [],
            "temperature": data.temperature, "top_p": data.top_p, "max_output_tokens": data.max_output_tokens,
            "previous_response_id": data.previous_response_id, "store": False, "text": {"format": {"type": "text"}},
            "usage": None if text is None else {
                "input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        }


async def response_events(gen: Generation, reply: _Reply) -> AsyncIterator[bytes]:
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        return sse_data({"type": kind, "sequence_number": seq - 1, **fields}, event=kind)

    where = {"item_id": reply.message_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=reply.body(None, None))
    yield event("response.in_progress", response=reply.body(None, None))
    yield event("response.output_item.added", output_index=0, item=reply.message("", "in_progress"))
    yield event("response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []})
    parts: list[str] = []
    reason: FinishReason | None = None
    async with aclosing(gen.deltas()) as deltas:
        async for delta in deltas:
            if delta.error:  # an engine error, or a drain at shutdown: the response ends as failed
                yield event("error", code="engine_error", message=delta.error, param=None)
                failed = {**reply.body(None, None), "status": "failed",
                          "error": {"code": "server_error", "message": delta.error}}
                yield event("response.failed", response=failed)
                return
            if delta.text:
                parts.append(delta.text)
                yield event("response.output_text.delta", **where, delta=delta.text, logprobs=[])
            reason = delta.finish_reason
    text = "".join(parts)
    yield event("response.output_text.done", **where, text=text, logprobs=[])
    yield event("response.content_part.done", **where,
                part={"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    final = reply.body(text, reason)
    yield event("response.output_item.done", output_index=0, item=final["output"][0])
    done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(done, response=final)


class ResponsesController(Controller):
    path = "/v1"
    tags = ["openai"]

    @post("/responses", status_code=200, summary="Responses API (typed SSE events when stream is true)")
    async def responses(self, request: Request[Any, Any, Any], data: ResponsesRequest) -> Response[Any]:
        messages = input_messages(data)

        async def prompt(gateway: Gateway, route: Route) -> list[int]:
            return await chat_prompt_ids(gateway, route.model, messages)

        gen = await start(request, _AsSampling(data), "responses", data.max_output_tokens, prompt)
        reply = _Reply(gen, data)
        if data.stream:
            return sse_stream(response_events(gen, reply))
        text, reason = await gen.collect()
        return Response(reply.body(text, reason))


class _AsSampling:
    """The Responses request seen through the sampling fields that chat completions use."""

    def __init__(self, data: ResponsesRequest) -> None:
        self.model, self.user, self.temperature, self.top_p = data.model, data.user, data.temperature, data.top_p
        self.n, self.seed, self.stop, self.top_k, self.min_p = 1, None, None, None, None
        self.presence_penalty = self.frequency_penalty = self.repetition_penalty = None
        self.ignore_eos = False
