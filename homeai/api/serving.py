"""What every request shares, whatever its API: who is asking, which class and model serve it (with the
model on the device), and an LLM request's life in the engine once admitted (``Generation``; metered by
the gateway itself, like every other submission: see gateway/metering.py).

Class: header X-HomeAI-Class > the API key's default class > a model alias in the policy > the user's
default class > the endpoint's default (``Gateway.route`` applies the last three). User: the API key's;
without keys (loopback), header X-HomeAI-User, else the OpenAI ``user`` field, else "anonymous".
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from litestar import Request

from homeai.api.auth import ANONYMOUS, resolve_caller
from homeai.api.drain import engine_error
from homeai.api.errors import BadRequest, to_api_error
from homeai.api.streaming import until_disconnect
from homeai.core.types import FinishReason, SamplingParams, TokenDelta, TokenLogprob
from homeai.engine.errors import QueueTimeoutError
from homeai.gateway.gateway import Gateway, Route
from homeai.gateway.metering import outcome_of_delta

log = logging.getLogger(__name__)

HEADER_CLASS, HEADER_USER = "x-homeai-class", "x-homeai-user"
HEADER_PRIORITY, HEADER_TIMEOUT_MS = "x-homeai-priority", "x-homeai-timeout-ms"


@dataclass(slots=True)
class RequestContext:
    """Who asks and how: the user, an explicit class (None: alias/user/endpoint default decide)."""

    user: str
    class_name: str | None
    priority_level: int | None
    timeout_us: int | None


def _int_header(request: Request[Any, Any, Any], name: str) -> int | None:
    value = request.headers.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"header {name} must be an integer, got {value!r}", param=name) from None


async def request_context(request: Request[Any, Any, Any], body_user: str | None = None) -> RequestContext:
    caller = await resolve_caller(request)
    user, key_class = caller.user, caller.default_class
    if user == ANONYMOUS:
        user = request.headers.get(HEADER_USER) or body_user or ANONYMOUS
    timeout_ms = _int_header(request, HEADER_TIMEOUT_MS)
    return RequestContext(user=user, class_name=request.headers.get(HEADER_CLASS) or key_class,
                          priority_level=_int_header(request, HEADER_PRIORITY),
                          timeout_us=timeout_ms * 1000 if timeout_ms and timeout_ms > 0 else None)


def normalize_model(model: str | None) -> str | None:
    """Ollama clients send ``name:latest``; we serve one version of each model."""
    if model and model.endswith(":latest"):
        return model[: -len(":latest")]
    return model or None


def route_request(gateway: Gateway, model: str | None, ctx: RequestContext, kind: str) -> Route:
    """Pick the class and model; a served model of the other kind (an LLM on /embeddings) is a 400, and
    so is a priority level the class does not have."""
    model = normalize_model(model)
    if model in gateway.llms and kind != "llm":
        raise BadRequest(f"model {model!r} is an LLM, not an embedding model", param="model")
    if model in gateway.embedders and kind != "embedding":
        raise BadRequest(f"model {model!r} is an embedding model, not an LLM", param="model")
    route = gateway.route(model, ctx.class_name, kind, ctx.user)
    check_priority(gateway, route, ctx.priority_level)
    return route


async def resident(gateway: Gateway, route: Route, ctx: RequestContext, keep_alive_s: float | None | str = "policy") \
        -> None:
    """Wait until the route's LLM is on the device (an on-demand or unloaded model loads now, off the
    device thread). The wait counts against the request's queue timeout, as a wait in its class queue
    would (REJECT; under DELAY it waits for the load), and the waiting requests are held to the queue's
    max_queue_size (429 past it); a model that cannot fit or failed to load is a 503 naming it. The model
    stays ``keep_alive_s`` after the request (Ollama's; "policy": the policy's)."""
    default = gateway.policy.model_policy(route.model).keep_alive_s
    gateway.keep_alive(route.model, default if keep_alive_s == "policy" else keep_alive_s)  # type: ignore[arg-type]
    qp = gateway.policy.classes[route.class_name].queue_policy(ctx.priority_level or
                                                               gateway.policy.classes[route.class_name]
                                                               .default_priority_level)
    timeout_us = qp.default_timeout_microseconds if qp.timeout_action == "REJECT" else 0
    if ctx.timeout_us and qp.allow_timeout_override:
        timeout_us = min(timeout_us, ctx.timeout_us) if timeout_us else ctx.timeout_us
    try:
        await gateway.ensure_llm(route.model, timeout_us / 1e6 if timeout_us else None, route.class_name,
                                 qp.max_queue_size)
    except Exception as exc:
        raise to_api_error(exc) from None


def check_priority(gateway: Gateway, route: Route, level: int | None) -> None:
    """X-HomeAI-Priority must be one of the class's levels (1 is served first); before, -1 was a 500 and 99
    queued at the lowest level."""
    if level is None:
        return
    levels = gateway.policy.classes[route.class_name].priority_levels
    if not 1 <= level <= levels:
        raise BadRequest(f"header X-HomeAI-Priority must be from 1 to {levels} in class {route.class_name!r}, "
                         f"got {level}", param=HEADER_PRIORITY)


def check_token_ids(ids: list[int], vocab_size: int, field: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} in {field} is outside the vocabulary [0, {vocab_size})", param=field)


class Generation:
    """One LLM request in the engine: submitted by ``open`` (whose first delta decides the HTTP status),
    then read by ``deltas`` or ``collect``. Leaving early aborts it (the gateway meters the outcome)."""

    def __init__(self, request: Request[Any, Any, Any], gateway: Gateway, route: Route, prompt_ids: list[int],
                 params: SamplingParams, ctx: RequestContext, kind: str, fits: bool = True) -> None:
        self.request = request
        self.fits = fits  # False: a constrained answer too long for the budget, never started (see open)
        self.gateway = gateway
        self.route, self.prompt_ids, self.params, self.ctx, self.kind = route, prompt_ids, params, ctx, kind
        self.request_id = uuid.uuid4().hex
        self.num_output_tokens = 0
        self.logprobs: list[TokenLogprob] = []  # every token's, when the params ask for them
        self._first: TokenDelta | None = None
        self._iterator: AsyncGenerator[TokenDelta, None] | None = None

    async def open(self) -> TokenDelta:
        """Queue the request and wait for its first delta; raises ApiError (400/429/503/499...).

        A constrained answer whose shortest valid form does not fit in its budget (a forced call, a
        JSON schema) is not started: it ends at once, empty, with finish reason "length", rather than
        in call syntax or JSON that the budget cuts (``admission.constrain``)."""
        route, ctx = self.route, self.ctx
        if not self.fits:
            self._iterator = _no_deltas()
            self._first = TokenDelta(self.request_id, "", [], len(self.prompt_ids), 0, FinishReason.LENGTH)
            return self._first
        self._iterator = self.gateway.generate(route, self.prompt_ids, self.params, ctx.user, self.request_id,
                                               ctx.priority_level, ctx.timeout_us, kind=self.kind)
        try:
            first = await until_disconnect(self.request, anext(self._iterator))
        except BaseException as exc:
            await self._iterator.aclose()
            raise to_api_error(exc) if isinstance(exc, Exception) else exc from None
        if first.error is not None:
            await self._iterator.aclose()
            if outcome_of_delta(first) == "timeout":  # the same error as an embedding's queue timeout
                raise to_api_error(QueueTimeoutError(f"{first.error} in class {route.class_name!r}"))
            raise engine_error(self.request, first.error)  # 503 when a drain ended it
        self._count(first)
        self._first = first
        return first

    async def deltas(self) -> AsyncGenerator[TokenDelta, None]:
        """The first delta, then the rest; closing this generator early aborts the request."""
        assert self._first is not None and self._iterator is not None, "open() first"
        async with aclosing(self._iterator) as rest:
            delta = self._first
            yield delta
            while not delta.finished:
                delta = await anext(rest)
                self._count(delta)
                yield delta

    async def collect(self) -> tuple[str, FinishReason | None]:
        """Non-streaming: the whole text and finish reason; a disconnect meanwhile aborts the request."""
        async def read() -> tuple[str, FinishReason | None, str | None]:
            parts: list[str] = []
            last: TokenDelta | None = None
            async with aclosing(self.deltas()) as stream:
                async for last in stream:
                    parts.append(last.text)
            return "".join(parts), last.finish_reason if last else None, last.error if last else None

        text, finish_reason, error = await until_disconnect(self.request, read())
        if error is not None:
            raise engine_error(self.request, error)
        return text, finish_reason

    def _count(self, delta: TokenDelta) -> None:
        self.num_output_tokens += len(delta.token_ids)
        self.logprobs += delta.logprobs


async def _no_deltas() -> AsyncGenerator[TokenDelta, None]:
    return
    yield  # an async generator that ends at once
