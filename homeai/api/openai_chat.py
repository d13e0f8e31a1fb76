"""Chat completions beyond plain text: messages with tool calls and results, the tools or response
format that constrain an answer, and the assistant message (content, tool_calls) read back from it."""

from __future__ import annotations

from typing import Any

from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import AssistantMessage, ChatCompletionRequest, ChatMessage
from homeai.api.structured import response_format_constraint
from homeai.api.tool_calls import parse_all
from homeai.api.tools import AnswerShape, answer_shape, assistant_calls_message, tool_result_message


def content_text(content: Any, field: str) -> str:
    """Message content as text: a string, or the text parts of a list (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type not in ("text", "input_text", "output_text") or part.text is None:
            raise BadRequest(f"only text content is supported, got {part.type!r}", param=f"{field}[{i}]")
        texts.append(part.text)
    return "".join(texts)


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Chat-template messages; developer means system; tool results and earlier calls are written as the
    model writes and reads them (``homeai.api.tools``)."""
    out = []
    for i, m in enumerate(messages):
        text = content_text(m.content, f"messages[{i}].content")
        if m.role in ("tool", "function"):
            out.append(tool_result_message(text))
        elif m.role == "assistant" and m.tool_calls:
            out.append(assistant_calls_message(text, openai_calls(m.tool_calls, f"messages[{i}].tool_calls")))
        else:
            out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    return out


def openai_calls(calls: list[dict[str, Any]], field: str) -> list[tuple[str, Any]]:
    """(name, arguments) of an assistant message's ``tool_calls``."""
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest("a tool call needs function.name", param=f"{field}[{j}].function.name")
        out.append((fn["name"], fn.get("arguments") or "{}"))
    return out


def chat_message(text: str, tools: bool) -> tuple[AssistantMessage, bool]:
    """The assistant message of a finished chat: content, and the calls read from the text."""
    if not tools:
        return AssistantMessage(text), False
    content, calls = parse_all(text)
    if not calls:
        return AssistantMessage(content), False
    wire = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return AssistantMessage(content or None, tool_calls=wire), True


def chat_shape(data: ChatCompletionRequest, class_choice: str) -> AnswerShape:
    """Tools or a response format, with the class's tool_choice when the request has none."""
    fmt = response_format_constraint(data.response_format)
    user_last = data.messages[-1].role == "user"
    return answer_shape(data.tools, data.tool_choice, data.parallel_tool_calls, fmt, class_choice, user_last)


def chat_logprobs_wanted(data: ChatCompletionRequest) -> int | None:
    if data.top_logprobs is not None and not data.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return (data.top_logprobs or 0) if data.logprobs else None
