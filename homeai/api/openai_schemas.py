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
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]  # 0: only the most likely token (as OpenAI and llama.cpp)
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=0, le=1_000_000)]
MaxTokens = Annotated[int, Meta(ge=1, le=1_000_000)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(ge=0.01, le=10.0)]  # logits are divided by it: 1e-300 overflowed
N = Annotated[int, Meta(ge=1, le=128)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
Stop = str | Annotated[list[str], Meta(max_length=16)]
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(Struct):
    """A part of a message; text parts are used, others (images, audio) are refused."""

    type: str
    text: str | None = None


class CalledFunction(Struct, kw_only=True):
    """A function an earlier assistant turn called (OpenAI: arguments as JSON text; Ollama: an object)."""

    name: str
    arguments: Any = None


class EarlierCall(Struct, kw_only=True):
    """An earlier assistant turn's tool call, as the client sends it back in the conversation."""

    function: CalledFunction
    id: str | None = None
    type: str = "function"


class FunctionDefinition(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object
    strict: bool | None = None


class FunctionTool(Struct, kw_only=True):
    """A chat (and Ollama) tool, ``{"type": "function", "function": {...}}``: the only kind we serve, so
    any other type is a 400 naming ``tools[i].type`` before the handler runs."""

    function: FunctionDefinition
    type: Literal["function"] = "function"


class JsonSchemaFormat(Struct, kw_only=True):
    schema: Any  # a JSON Schema (an object, or true/false)
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Struct, kw_only=True):
    """Chat ``response_format``: text, json_object, or json_schema (always strict: a grammar enforces it)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatMessage(Struct):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[EarlierCall] | None = None


class StreamOptions(Struct):
    include_usage: bool = False


class _Sampling(Struct, kw_only=True):
    """Fields shared by chat and text completions."""

    model: str
    stream: bool | None = None  # OpenAI: boolean or null (false)
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    n: N | None = None  # OpenAI: integer or null (1)
    user: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None  # only empty: a bias is refused, never dropped silently


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    functions: list[Any] | None = None  # the deprecated form of tools: refused, never dropped silently
    function_call: Any = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[FunctionTool] | None = None  # homeai.api.tools
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[Any]  # a string, [string], or token ids [int, ...] / [[int, ...]]
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    suffix: str | None = None  # refused unless empty (no fill-in-the-middle), never dropped silently
    best_of: Annotated[int, Meta(ge=1)] | None = None  # refused above 1


class EmbeddingRequest(Struct, kw_only=True):
    model: str
    input: str | list[Any]  # a string, strings, token ids, or lists of token ids
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


# ---- responses ----------------------------------------------------------------------------------
class PromptTokensDetails(Struct):
    cached_tokens: int  # found in the prefix cache, not computed again


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


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


class ResponsesFunctionTool(Struct, kw_only=True):
    """A Responses tool: the function's fields beside its type (any other type is a 400)."""

    name: str
    type: Literal["function"] = "function"
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(Struct, kw_only=True, omit_defaults=True):
    """Responses ``text.format``: like ``response_format``, with a json_schema's fields beside its type."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: Any = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, kw_only=True, omit_defaults=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(Struct, kw_only=True):
    """The Responses API (Home Assistant's OpenAI integration): ``input`` is text or a list of items."""

    model: str
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]
    instructions: str | None = None
    stream: bool | None = None  # OpenAI: boolean or null (false)
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    user: str | None = None
    tools: list[ResponsesFunctionTool] | None = None  # homeai.api.tools
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None  # stored conversation state (refused: this server stores none)
    prompt: Any = None  # a stored prompt template (refused: none is stored here)
    metadata: dict[str, str] | None = None
    text: TextConfig | None = None
    reasoning: dict[str, Any] | None = None


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Struct):
    """OpenAI's error shape, used for every error under /v1."""

    error: ErrorDetail
