"""Ollama request bodies as msgspec Structs (responses are built as plain dicts, as Ollama sends them).

Like Ollama, unknown fields and options are accepted and ignored, so Home Assistant, Open WebUI and
the ``ollama`` package can send whatever their version sends. ``think`` and ``num_ctx`` have no effect
(the context is the served one); ``keep_alive`` says how long the LLM stays loaded after the request
(``homeai.gateway.model_pool``). A value Ollama would refuse is refused here too: a ``keep_alive`` that is
neither a Go duration ("5m", "1h30m", "0", "-1m") nor a number of seconds. A ``num_ctx`` above the
model's context is served in the model's own and logged, as Ollama does (Home Assistant sends 8,192 on
every chat). ``tools`` and ``format`` ("json" or a JSON
Schema) constrain the answer (``homeai.api.tools``, ``structured``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from homeai.api.openai_schemas import (
    EarlierCall,
    FunctionTool,
    MinP,
    RepetitionPenalty,
    Seed,
    Temperature,
    TopK,
    TopP,
)
from homeai.policy.durations import parse_keep_alive

KeepAlive = str | int | float | None


def check_keep_alive(value: KeepAlive) -> None:
    """ValueError unless ``value`` is what Ollama takes: a Go duration string or a number of seconds."""
    if value is not None:
        parse_keep_alive(value)


class _KeepsAlive(Struct, kw_only=True):
    """A request with Ollama's ``keep_alive``: how long its LLM stays loaded after it (0: unloaded once
    idle; negative: stays; a pinned model always stays)."""

    keep_alive: KeepAlive = None

    def __post_init__(self) -> None:
        check_keep_alive(self.keep_alive)


# Whole-number options also come as JSON floats: Home Assistant keeps its form's numbers as floats and
# sends ``"num_ctx": 8192.0``; Ollama's Go side reads every number as a float64 and truncates it. So do we.
NumPredict = Annotated[int, Meta(ge=-2, le=1_000_000)] | Annotated[float, Meta(ge=-2, le=1_000_000)]
WholeTopK = TopK | Annotated[float, Meta(ge=0, le=1_000_000)]
WholeSeed = Seed | Annotated[float, Meta(ge=-(2**63), lt=2**63)]
NumCtx = Annotated[int, Meta(ge=1)] | Annotated[float, Meta(ge=1, lt=2**63)]
RepeatLastN = Annotated[int, Meta(ge=-1, le=1_000_000)] | Annotated[float, Meta(ge=-1, le=1_000_000)]
WHOLE_OPTIONS = ("num_predict", "top_k", "seed", "num_ctx", "repeat_last_n")


class Options(Struct, kw_only=True):
    """Model options (Ollama's ``options``): the sampling subset we honour. ``seed`` below 0 is Ollama's
    "random" (its default is -1); ``repeat_last_n`` is how many of the last tokens ``repeat_penalty``
    looks back on (Ollama's default 64; -1 the whole context, 0 off)."""

    num_predict: NumPredict | None = None  # -1: no limit, -2: fill the context
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: WholeTopK | None = None
    min_p: MinP | None = None
    seed: WholeSeed | None = None
    stop: Annotated[list[str], Meta(max_length=16)] | None = None
    num_ctx: NumCtx | None = None
    repeat_penalty: RepetitionPenalty | None = None
    repeat_last_n: RepeatLastN | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None

    def __post_init__(self) -> None:
        for name in WHOLE_OPTIONS:
            value = getattr(self, name)
            if isinstance(value, float):
                setattr(self, name, int(value))  # toward zero, as Go's int(float64)


class OllamaMessage(Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[EarlierCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class ChatRequest(_KeepsAlive, kw_only=True):
    model: str
    messages: list[OllamaMessage] = []
    stream: bool = True
    options: Options | None = None
    tools: list[FunctionTool] | None = None
    format: Any = None
    think: bool | str | None = None


class GenerateRequest(_KeepsAlive, kw_only=True):
    model: str
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    stream: bool = True
    options: Options | None = None
    context: list[int] | None = None  # token ids of an earlier answer to continue from
    images: list[str] | None = None
    suffix: str | None = None
    template: str | None = None
    format: Any = None
    think: bool | str | None = None


class EmbedRequest(_KeepsAlive, kw_only=True):
    model: str
    input: str | Annotated[list[str], Meta(max_length=2048)] = ""
    truncate: bool = True
    options: Options | None = None
    dimensions: Annotated[int, Meta(ge=1)] | None = None


class EmbeddingsRequest(_KeepsAlive, kw_only=True):
    """The legacy single-text endpoint /api/embeddings."""

    model: str
    prompt: str = ""
    options: Options | None = None


class ModelRequest(Struct, kw_only=True):
    """/api/show and /api/pull name the model as ``model`` (older clients: ``name``)."""

    model: str | None = None
    name: str | None = None
    stream: bool = True
    insecure: bool = False
    verbose: bool = False

    @property
    def model_name(self) -> str | None:
        return self.model or self.name
