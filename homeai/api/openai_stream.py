"""The OpenAI encoders: an admitted chat or text completion's answer as OpenAI's SSE chunks
(``chat.completion.chunk`` / ``text_completion`` objects, an optional final usage chunk, ``data: [DONE]``)
or as one response body. Tool calls stream as OpenAI streams them (index, id and name, then the arguments),
each once it is complete (``generation.AnswerReader``)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from homeai.api.admission import Admission
from homeai.api.generation import AnswerReader, Generation
from homeai.api.logprobs import chat_logprobs, completion_logprobs
from homeai.api.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
    PromptTokensDetails,
    Usage,
)
from homeai.api.streaming import SSE_DONE, sse_data
from homeai.api.tool_calls import ParseEvent, ToolCall, parse_all
from homeai.core.types import FinishReason, TokenLogprob

CHAT_CHUNK, TEXT_COMPLETION = "chat.completion.chunk", "text_completion"


def finish_reason(reason: FinishReason | None, calls: bool = False) -> str:
    if reason == FinishReason.LENGTH:
        return "length"
    return "tool_calls" if calls else "stop"


def usage(gen: Generation) -> Usage:
    n_in, n_out = len(gen.prompt_ids), gen.num_output_tokens
    return Usage(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=gen.num_cached_tokens))


def wire_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def chat_message(text: str, reads_calls: bool) -> tuple[AssistantMessage, bool]:
    """The assistant message of a whole answer: content, and the calls read from the text."""
    if not reads_calls:
        return AssistantMessage(text), False
    content, calls = parse_all(text)
    if not calls:
        return AssistantMessage(content), False
    return AssistantMessage(content or None, tool_calls=wire_calls(calls)), True


async def chat_completion(admitted: Admission, want_logprobs: bool) -> ChatCompletion:
    """The whole answer as one chat.completion."""
    gen = admitted.generation
    text, reason = await gen.collect()
    message, called = chat_message(text, admitted.reads_calls)
    tokenizer = gen.gateway.llm(gen.route.model).tokenizer
    lp = chat_logprobs(gen.logprobs, tokenizer) if want_logprobs else None
    choice = ChatChoice(0, message, finish_reason(reason, called), lp)
    return ChatCompletion("chatcmpl-" + gen.request_id, int(time.time()), gen.route.model, [choice], usage(gen))


async def text_completion(admitted: Admission, echo: str, want_logprobs: bool) -> Completion:
    gen = admitted.generation
    text, reason = await gen.collect()
    tokenizer = gen.gateway.llm(gen.route.model).tokenizer
    lp = completion_logprobs(gen.logprobs, tokenizer, len(echo)) if want_logprobs else None
    choice = CompletionChoice(0, echo + text, finish_reason(reason), lp)
    return Completion("cmpl-" + gen.request_id, int(time.time()), gen.route.model, [choice], usage(gen))


def _chat_delta(e: ParseEvent) -> dict[str, Any] | None:
    """A parse event as a chat chunk's ``delta`` (None: nothing to send, a call's end)."""
    if e.text:
        return {"content": e.text}
    if e.call is not None and e.fragment:
        return {"tool_calls": [{"index": e.call.index, "function": {"arguments": e.fragment}}]}
    if e.call is not None and not e.done:
        return {"tool_calls": [{"index": e.call.index, "id": e.call.id, "type": "function",
                                "function": {"name": e.call.name, "arguments": ""}}]}
    return None


async def stream_chunks(admitted: Admission, obj: str, include_usage: bool,
                        prefix: str = "") -> AsyncGenerator[bytes, None]:
    """SSE for chat (``delta``, obj CHAT_CHUNK) or text completions (``text``, obj TEXT_COMPLETION, after the
    echoed ``prefix``); closing it aborts the request. An engine error (or a drain at shutdown) is an
    error event, then the usual end."""
    gen = admitted.generation
    is_chat = obj == CHAT_CHUNK
    created, rid = int(time.time()), ("chatcmpl-" if is_chat else "cmpl-") + gen.request_id
    tokenizer = gen.gateway.llm(gen.route.model).tokenizer
    reader = AnswerReader(gen, admitted.reads_calls)
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

    if is_chat:  # an answer that may be calls starts without content: all calls, its content stays null (as
        # non-streamed and OpenAI's; "" made the SDK's helpers see an empty text and report a content event)
        yield piece({"role": "assistant"} if admitted.reads_calls else {"role": "assistant", "content": ""})
    elif prefix:
        yield piece({}, text=prefix)
    async with aclosing(reader.steps()) as steps:
        async for step in steps:
            if step.error:
                yield sse_data({"error": {"message": step.error, "type": "server_error", "param": None,
                                          "code": "engine_error"}})
                yield SSE_DONE
                return
            logprobs = step.logprobs or None
            if is_chat:
                for body in filter(None, map(_chat_delta, step.events)):
                    yield piece(body, logprobs=logprobs)
                    logprobs = None  # a delta's logprobs ride on its first chunk
                if logprobs:
                    yield piece({}, logprobs=logprobs)
            elif step.text or logprobs:
                yield piece({}, logprobs=logprobs, text=step.text)
            if step.finished:
                yield piece({}, finish_reason(step.finish_reason, bool(reader.calls)))
    if include_usage:
        yield chunk(None, usage=usage(gen))
    yield SSE_DONE
