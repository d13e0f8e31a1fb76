"""POST /v1/responses: OpenAI's Responses API, which Home Assistant's OpenAI integration speaks.

Stateless: nothing is stored, and each call sends its whole conversation as ``input`` (``store`` is
accepted and answered ``false``); a ``previous_response_id`` names a response this server does not have,
so it is a 400 naming the field, as OpenAI answers an unknown one. Function tools are called as in chat completions
(``homeai.api.tools``): each call is a ``function_call`` output item, and ``function_call_output`` input
items bring the results back. ``text.format`` json_object / json_schema constrain the text.
Streaming sends the typed events (``response.created`` ... ``response.completed``) the SDK expects.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import msgspec
from litestar import Controller, Request, Response, post

from homeai.api.admission import Admission, LLMRequest, PromptFields, admit
from homeai.api.errors import BadRequest
from homeai.api.generation import AnswerReader, Generation
from homeai.api.openai_schemas import ResponsesRequest
from homeai.api.responses_output import OutputItems
from homeai.api.services import Injected
from homeai.api.streaming import sse_data, sse_stream
from homeai.api.structured import text_format_constraint
from homeai.api.tool_calls import ParseEvent, ToolCallParser
from homeai.api.tools import ToolPlan, assistant_calls_message, parse_tools, tool_result_message
from homeai.core.types import FinishReason, SamplingParams
from homeai.gateway.gateway import Gateway

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
    """``instructions`` + ``input`` as chat-template messages; calls and their outputs as the model
    writes and reads them (consecutive calls form one assistant turn)."""
    messages = [{"role": "system", "content": data.instructions}] if data.instructions else []
    if isinstance(data.input, str):
        return [*messages, {"role": "user", "content": data.input}]
    calls: list[tuple[str, Any]] = []
    for i, item in enumerate(data.input):
        kind = item.get("type", "message")
        if kind == "item_reference":  # like previous_response_id: it names an item stored by the server
            raise BadRequest(f"input item {item.get('id')!r} not found: this server stores no responses; send the "
                             "item itself", param=f"input[{i}]")
        if kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise BadRequest("a function_call needs a name", param=f"input[{i}].name")
            calls.append((item["name"], item.get("arguments") or "{}"))
            continue
        if calls:
            messages.append(assistant_calls_message("", calls))
            calls = []
        if kind == "message" and item.get("role") in _ROLES:
            text = _item_text(item.get("content", ""), f"input[{i}].content")
            messages.append({"role": _ROLES[item["role"]], "content": text})
        elif kind == "function_call_output":
            output = item.get("output", "")
            if isinstance(output, list):  # input_text parts, as the SDK's types allow: their text
                output = _item_text(output, f"input[{i}].output")
            messages.append(tool_result_message(output if isinstance(output, str) else json.dumps(output)))
        elif kind == "message":
            raise BadRequest(f"unknown role {item.get('role')!r}", param=f"input[{i}].role")
        # other items (reasoning, web search calls...) carry nothing our models can use
    if calls:
        messages.append(assistant_calls_message("", calls))
    if not any(m["role"] == "user" for m in messages):
        raise BadRequest("input has no user message", param="input")
    return messages


def response_request(data: ResponsesRequest) -> LLMRequest:
    """The adapter: a Responses body as the one typed request ``admit`` takes."""
    if data.previous_response_id is not None:
        raise BadRequest(f"previous response {data.previous_response_id!r} not found: this server stores no "
                         "responses; send the whole conversation as input", param="previous_response_id",
                         code="previous_response_not_found")
    # refused, never dropped: answered without them, the client got a 200 with no history or no template
    if data.conversation is not None:
        raise BadRequest("conversation not found: this server stores no conversations; send the whole "
                         "conversation as input", param="conversation", code="conversation_not_found")
    if data.prompt is not None:
        raise BadRequest("stored prompts are not supported: send the instructions and input themselves",
                         param="prompt")
    last = data.input if isinstance(data.input, str) else data.input[-1]
    user_last = isinstance(last, str) or (last.get("type", "message") == "message" and last.get("role") == "user")
    sampling = SamplingParams(temperature=1.0 if data.temperature is None else data.temperature,
                              top_p=1.0 if data.top_p is None else data.top_p)
    return LLMRequest(
        data.model, "response", sampling, data.max_output_tokens, messages=input_messages(data),
        tools=parse_tools(data.tools), tool_choice=data.tool_choice, parallel_tool_calls=data.parallel_tool_calls,
        answer_format=text_format_constraint(data.text.format if data.text else None), user_spoke_last=user_last,
        body_user=data.user, fields=PromptFields("input", "max_output_tokens"))


class _Reply:
    """The response object as the SDK parses it, around the output items."""

    def __init__(self, gen: Generation, data: ResponsesRequest, plan: ToolPlan) -> None:
        self.gen, self.data, self.plan = gen, data, plan
        self.id = "resp_" + gen.request_id
        self.created_at = int(time.time())

    def body(self, output: list[dict[str, Any]] | None, reason: FinishReason | None) -> dict[str, Any]:
        incomplete = reason == FinishReason.LENGTH
        status = "in_progress" if output is None else "incomplete" if incomplete else "completed"
        n_in, n_out = len(self.gen.prompt_ids), self.gen.num_output_tokens
        data = self.data
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.gen.route.model, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete and output is not None else None,
            "instructions": data.instructions, "metadata": data.metadata or {}, "output": output or [],
            "parallel_tool_calls": self.plan.parallel, "tool_choice": self._tool_choice(),
            "tools": [{"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.parameters, "strict": True} for t in self.plan.tools],
            "temperature": data.temperature, "top_p": data.top_p, "max_output_tokens": data.max_output_tokens,
            "previous_response_id": data.previous_response_id, "store": False,
            "text": msgspec.to_builtins(data.text) if data.text else {"format": {"type": "text"}},
            "usage": None if output is None else {
                "input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                "input_tokens_details": {"cached_tokens": self.gen.num_cached_tokens, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}},
        }


    def _tool_choice(self) -> Any:
        """What was applied: the request's named function, else the mode (a class may force "required"
        where the request said nothing; "auto" was reported then)."""
        choice = self.data.tool_choice
        if isinstance(choice, dict) or not self.plan.tools:
            return choice or "auto"
        return self.plan.mode


async def response_events(admitted: Admission, reply: _Reply) -> AsyncGenerator[bytes, None]:
    """The typed SSE events of a streamed response; an engine error (or a drain) ends it as failed."""
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        return sse_data({"type": kind, "sequence_number": seq - 1, **fields}, event=kind)

    yield event("response.created", response=reply.body(None, None))
    yield event("response.in_progress", response=reply.body(None, None))
    items = OutputItems(reply.gen.request_id)
    reason: FinishReason | None = None
    async with aclosing(AnswerReader(admitted.generation, admitted.reads_calls).steps()) as steps:
        async for step in steps:
            if step.error:  # what was streamed stays in the failed response, its open item closed incomplete
                if items.items:
                    for kind, fields in items.feed(step.events, True, FinishReason.LENGTH):
                        yield event(kind, **fields)
                yield event("error", code="engine_error", message=step.error, param=None)
                output = items.output(FinishReason.LENGTH) if items.items else []
                failed = {**reply.body(output, None), "status": "failed",
                          "error": {"code": "server_error", "message": step.error}}
                yield event("response.failed", response=failed)
                return
            for kind, fields in items.feed(step.events, step.finished, step.finish_reason):
                yield event(kind, **fields)
            reason = step.finish_reason
    final = reply.body(items.output(reason), reason)
    done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(done, response=final)


async def response_body(admitted: Admission, reply: _Reply) -> dict[str, Any]:
    """The whole response at once (not streamed)."""
    text, reason = await admitted.generation.collect()
    if admitted.reads_calls:
        parser = ToolCallParser()
        events = parser.feed(text) + parser.finish()
    else:
        events = [ParseEvent(text=text)] if text else []
    items = OutputItems(reply.gen.request_id)
    items.feed(events, True, reason)
    return reply.body(items.output(reason), reason)


class ResponsesController(Controller):
    path = "/v1"
    tags = ["openai"]

    @post("/responses", status_code=200, summary="Responses API (typed SSE events when stream is true)")
    async def responses(self, request: Request[Any, Any, Any], data: ResponsesRequest,
                        gateway: Injected[Gateway]) -> Response[Any]:
        admitted = await admit(request, gateway, response_request(data))
        reply = _Reply(admitted.generation, data, admitted.plan)
        if data.stream:
            return sse_stream(response_events(admitted, reply))
        return Response(await response_body(admitted, reply))
