"""OpenAI request and response bodies as msgspec Structs.

Only what we serve is described; unknown fields are accepted and ignored (clients send many we do not
use). Constraints live in the types, so a wrong value is a 400 naming the field before any work starts,
and the OpenAPI schema tells generated clients (and schemathesis) what is valid. vLLM's extensions
``top_k``, ``min_p``, ``repetition_penalty`` and ``ignore_eos`` are accepted too (the bench uses them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=0, le=1_000_000)]
MaxTokens = Annotated[int, Meta(ge=1, le=1_000_000)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=10.0)]
N = Annotated[int, Meta(ge=1, le=128)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
Stop = str | Annotated[list[str], Meta(max_length=16)]
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(Struct):
    """A part of a message; text parts are used, others (images, audio) are refused."""

    type: str
    text: str | None = None


class ChatMessage(Struct):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class StreamOptions(Struct):
    include_usage: bool = False


class _Sampling(Struct, kw_only=True):
    """Fields shared by chat and text completions."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    n: N = 1
    user: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool = False


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[dict[str, Any]] | None = None  # function tools (homeai.api.tools)
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None  # text | json_object | json_schema (always strict)


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[Any]  # a string, [string], or token ids [int, ...] / [[int, ...]]
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None


class EmbeddingRequest(Struct, kw_only=True):
    model: str
    input: str | list[Any]  # a string, strings, token ids, or lists of token ids
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


# ---- responses ----------------------------------------------------------------------------------
class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(Struct):
    content: str | None
    role: str = "assistant"
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | None = None


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    object: str = "text_completion"
    system_fingerprint: str | None = None


class EmbeddingData(Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct):
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str = "homeai"
    object: str = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class ResponsesRequest(Struct, kw_only=True):
    """The Responses API (Home Assistant's OpenAI integration): ``input`` is text or a list of items."""

    model: str
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]
    instructions: str | None = None
    stream: bool = False
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    user: str | None = None
    tools: list[dict[str, Any]] | None = None  # function tools (homeai.api.tools)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Struct):
    """OpenAI's error shape, used for every error under /v1."""

    error: ErrorDetail
