"""One way in for every LLM request: ``admit`` takes the typed request an API's adapter built (OpenAI chat,
text completions, Responses, Ollama chat and generate) and routes it once, loads its model if needed,
settles its answer's shape once (tools or format, with the class's tool_choice), builds the prompt once,
checks every limit once, compiles the grammar once and submits; it returns when the first token is out
(or raises the ApiError the client gets). Each API's encoder then turns the answer into its wire format.

Refusals are BadRequest naming the request's own field (``messages``, ``prompt``, ``input``;
``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``, ``options.num_predict``), so a refused
request never reaches the engine or its meter.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from litestar import Request

from homeai.api.errors import BadRequest
from homeai.api.generation import Generation
from homeai.api.offload import INLINE_CHARS, text_size, tokenize
from homeai.api.routing import check_token_ids, request_context, resident, route_request, warn_num_ctx
from homeai.api.structured import Sourced
from homeai.api.tools import AnswerShape, ToolPlan, ToolSpec, answer_shape, with_tools_prompt
from homeai.core.types import SamplingParams
from homeai.engine.builder import chat_prompt_ids, template_has_tools
from homeai.engine.llm_engine import LLMEngine, RequestError
from homeai.gateway.gateway import Gateway, Route
from homeai.policy.schema import ClassPolicy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PromptFields:
    """How the request names its prompt and its output limit (a 400 about their length names them)."""

    prompt: str = "messages"
    max_tokens: str = "max_tokens"


@dataclass(slots=True)
class LLMRequest:
    """An LLM request whatever API brought it: the prompt (chat messages, text, or token ids, after
    ``context_ids``), sampling with ``max_tokens`` unset until the route is known (``requested_max_tokens``:
    the client's, None for "as much as fits"), and what the answer may be (tools, a format)."""

    model: str | None
    kind: Literal["chat", "completion", "response"]
    sampling: SamplingParams
    requested_max_tokens: int | None
    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    context_ids: list[int] = field(default_factory=list)
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    answer_format: Sourced | None = None
    user_spoke_last: bool = True
    logprobs: int | None = None
    body_user: str | None = None
    keep_alive_s: float | None | Literal["policy"] = "policy"
    num_ctx: int | None = None
    fields: PromptFields = field(default_factory=PromptFields)


@dataclass(slots=True)
class Admission:
    """An admitted request: its generation (first delta out) and the tool plan its answer follows."""

    generation: Generation
    plan: ToolPlan

    @property
    def reads_calls(self) -> bool:
        return self.plan.active


async def admit(request: Request[Any, Any, Any], gateway: Gateway, req: LLMRequest) -> Admission:
    """Route, load, shape, tokenize, check, constrain and submit ``req``; see the module docstring."""
    ctx = await request_context(request, req.body_user)
    route = route_request(gateway, req.model, ctx, "llm")
    await resident(gateway, route, ctx, req.keep_alive_s)
    engine, cp = gateway.llm(route.model), gateway.class_policy(route.class_name)
    check_num_ctx(engine, route, req.num_ctx)
    shape = answer_shape(req.tools, req.tool_choice, req.parallel_tool_calls, req.answer_format, cp.tool_choice,
                         req.user_spoke_last)
    prompt_ids = [*req.context_ids, *await prompt_ids_of(engine, req, shape)]
    params = dataclasses.replace(req.sampling, logprobs=req.logprobs,
                                 max_tokens=max_tokens_of(engine, cp, route, prompt_ids, req))
    fits = await constrain(engine, prompt_ids, params, shape.constraint)
    generation = Generation(request, gateway, route, prompt_ids, params, ctx, req.kind, fits)
    await generation.open()
    return Admission(generation, shape.plan)


def check_num_ctx(engine: LLMEngine, route: Route, num_ctx: int | None) -> None:
    """Ollama's ``options.num_ctx``: the request is served in the model's own context whatever it asks. Above
    it, Ollama serves at the model's context and logs a warning: Home Assistant asks for 8,192 on every chat
    by default, and a 400 here failed each of them. A prompt that does not fit is refused on its own."""
    if num_ctx is not None and num_ctx > engine.max_model_len:
        warn_num_ctx(route.model, num_ctx, engine.max_model_len)


async def prompt_ids_of(engine: LLMEngine, req: LLMRequest, shape: AnswerShape) -> list[int]:
    """The prompt's token ids: chat messages through the model's own template (off the event loop unless
    short: ``offload``), text encoded as it is, or token ids checked against the vocabulary."""
    check_token_ids(req.context_ids, engine.tokenizer_size, "context")
    if req.messages is not None:
        messages, tools = req.messages, shape.plan.tools if shape.plan.active else None
        if tools and not template_has_tools(engine.tokenizer):
            messages, tools = with_tools_prompt(messages, tools), None
        definitions = [t.as_openai() for t in tools] if tools else None
        size = text_size(messages) + (INLINE_CHARS + 1 if definitions else 0)  # tools: long JSON schemas
        try:
            return await tokenize(size, chat_prompt_ids, engine.tokenizer, messages, definitions)
        except Exception as exc:  # the template refused these messages (say, roles out of order)
            raise BadRequest(f"cannot apply the chat template: {exc}", param=req.fields.prompt) from exc
    if req.text is not None:  # as vLLM and Ollama's runner: the model's BOS first (Llama 3 needs it), unless
        # the text goes on from earlier token ids or already starts with it
        bos = getattr(engine.tokenizer, "bos_token", None)
        special = not req.context_ids and not (bos and req.text.startswith(bos))
        return list(await tokenize(len(req.text), engine.tokenizer.encode, req.text, add_special_tokens=special))
    ids = list(req.token_ids or [])
    check_token_ids(ids, engine.tokenizer_size, req.fields.prompt)
    return ids


def max_tokens_of(engine: LLMEngine, cp: ClassPolicy, route: Route, prompt_ids: list[int], req: LLMRequest) -> int:
    """The output limit the request gets, after every limit on its prompt is checked: the engine's
    context, the class's max_prompt_tokens, and the KV cache for prompt + output. An unset limit means
    "until the context or the KV cache is full" (a small cache must not turn every request without
    max_tokens into a 400); the class's max_output_tokens and the context left cap any limit."""
    field_name, n, limit = req.fields.prompt, len(prompt_ids), engine.max_model_len
    if n == 0:
        raise BadRequest(f"{field_name} is empty: the prompt has no tokens", param=field_name)
    if n >= limit:
        raise BadRequest(f"{field_name} has {n} tokens; the context holds {limit} (prompt + at least 1 output "
                         "token)", param=field_name, code="context_length_exceeded")
    if cp.max_prompt_tokens and n > cp.max_prompt_tokens:
        raise BadRequest(f"{field_name} has {n} tokens; class {route.class_name!r} allows {cp.max_prompt_tokens}",
                         param=field_name, code="context_length_exceeded")
    bm = engine.scheduler.block_manager
    requested = req.requested_max_tokens
    if requested is None:
        requested = max(1, min(limit, bm.num_blocks * bm.block_size) - n)
    out = min(requested, cp.max_output_tokens or requested, limit - n)
    if bm.blocks_needed(n + out) > bm.num_blocks:
        param = field_name if bm.blocks_needed(n + 1) > bm.num_blocks else req.fields.max_tokens
        raise BadRequest(f"{field_name} ({n} tokens) + {req.fields.max_tokens} ({out}) exceed the KV cache "
                         f"({bm.num_blocks * bm.block_size} tokens)", param=param, code="context_length_exceeded")
    return out


async def constrain(engine: LLMEngine, prompt_ids: list[int], params: SamplingParams, sourced: Sourced | None) \
        -> bool:
    """Compile the answer's grammar on a worker thread (a bad schema is a 400 on the field it came from)
    and put it on ``params``; False when even its shortest answer does not fit the output limit, so the
    request is not started (``Generation``) rather than cut inside call syntax or JSON."""
    if sourced is None:
        return True
    constraint, field_name = sourced
    if params.ignore_eos:  # a finished grammar allows only the end: ignoring it leaves no token
        raise BadRequest(f"ignore_eos cannot be combined with {field_name}", param="ignore_eos")
    try:
        need = await engine.compile_constraint(constraint)
    except RequestError as exc:
        raise BadRequest(str(exc), param=field_name) from exc
    params.constraint = constraint
    if need is not None and need > params.max_tokens:
        log.info("constrained answer (%s) needs %d output tokens, the budget is %d: not started", field_name,
                 need, params.max_tokens)
        return False
    return True
