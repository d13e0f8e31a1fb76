"""The OpenAI adapters: a chat or text completion body turned into the one typed ``LLMRequest`` that
``admission.admit`` takes (messages with tool calls and results as the model reads them, the tools or
response format that constrain the answer, OpenAI's sampling defaults)."""

from __future__ import annotations

from typing import Any

from homeai.api.admission import LLMRequest, PromptFields
from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from homeai.api.structured import response_format_constraint
from homeai.api.tools import assistant_calls_message, earlier_calls, parse_tools, tool_result_message
from homeai.core.types import SamplingParams
from homeai.gateway.gateway import Gateway


def sampling_params(data: ChatCompletionRequest | CompletionRequest) -> SamplingParams:
    """OpenAI defaults (temperature 1, top_p 1) for whatever the request leaves out; max_tokens is settled
    by admission."""
    if data.n not in (None, 1):
        raise BadRequest("only n=1 is supported", param="n")
    if data.logit_bias:
        raise BadRequest("logit_bias is not supported", param="logit_bias")
    if data.stream_options is not None and not data.stream:  # as OpenAI answers it
        raise BadRequest("stream_options is only allowed when stream is true", param="stream_options")
    stop = [data.stop] if isinstance(data.stop, str) else list(data.stop or [])
    return SamplingParams(
        temperature=1.0 if data.temperature is None else data.temperature,
        top_p=1.0 if data.top_p is None else data.top_p, top_k=data.top_k or 0, min_p=data.min_p or 0.0,
        presence_penalty=data.presence_penalty or 0.0, frequency_penalty=data.frequency_penalty or 0.0,
        repetition_penalty=data.repetition_penalty or 1.0, seed=data.seed, max_tokens=1,
        stop=[s for s in stop if s], ignore_eos=data.ignore_eos)


def chat_request(data: ChatCompletionRequest) -> LLMRequest:
    for legacy in ("functions", "function_call"):
        if getattr(data, legacy) is not None:
            raise BadRequest(f"{legacy} is the deprecated form of tools, which is supported: send tools and "
                             "tool_choice", param=legacy)
    limit = "max_completion_tokens" if data.max_completion_tokens else "max_tokens"
    return LLMRequest(
        data.model, "chat", sampling_params(data), data.max_completion_tokens or data.max_tokens,
        messages=message_dicts(data.messages), tools=parse_tools(data.tools), tool_choice=data.tool_choice,
        parallel_tool_calls=data.parallel_tool_calls, answer_format=response_format_constraint(data.response_format),
        user_spoke_last=data.messages[-1].role == "user", logprobs=chat_logprobs_wanted(data), body_user=data.user,
        fields=PromptFields("messages", limit))


# OpenAI's legacy completions (and vLLM's) stop at 16 tokens when max_tokens is unset; a client written for
# them got up to the class's max_output_tokens (1,024 in chat) here, and waited that much longer.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def completion_request(data: CompletionRequest) -> LLMRequest:
    """A string, [string], or token ids (one prompt: n=1)."""
    raw = data.prompt
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        raw = raw[0]  # one prompt in a list
    if data.suffix:
        raise BadRequest("suffix (fill in the middle) is not supported", param="suffix")
    if data.best_of not in (None, 1):
        raise BadRequest("only best_of=1 is supported", param="best_of")
    max_tokens = data.max_tokens if data.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    req = LLMRequest(data.model, "completion", sampling_params(data), max_tokens, logprobs=data.logprobs,
                     body_user=data.user, fields=PromptFields("prompt", "max_tokens"))
    if isinstance(raw, str):
        req.text = raw
    elif raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        req.token_ids = list(raw)
    else:
        raise BadRequest("prompt must be a string or a list of token ids (one prompt: n=1)", param="prompt")
    return req


def echo_text(gateway: Gateway, model: str, req: LLMRequest) -> str:
    """The prompt as ``echo`` puts it before the answer: the text as sent, or token ids decoded."""
    if req.text is not None:
        return req.text
    return str(gateway.llm(model).tokenizer.decode(req.token_ids or [], skip_special_tokens=False))


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
            out.append(assistant_calls_message(text, earlier_calls(m.tool_calls)))
        else:
            out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    return out


def chat_logprobs_wanted(data: ChatCompletionRequest) -> int | None:
    if data.top_logprobs is not None and not data.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return (data.top_logprobs or 0) if data.logprobs else None
