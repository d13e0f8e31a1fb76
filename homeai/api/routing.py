"""Who is asking and what serves them, for every request whatever its API: the caller (user, explicit
class, priority level, queue timeout), the class and model (``route_request``), and the model made
resident before the request queues (``resident``).

Class: header X-HomeAI-Class > the API key's default class > a model alias in the policy > the user's
default class > the endpoint's default (``Gateway.route`` applies the last three). User: the API key's;
without keys (loopback), header X-HomeAI-User, else the OpenAI ``user`` field, else "anonymous".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from litestar import Request

from homeai.api.auth import ANONYMOUS, resolve_caller
from homeai.api.errors import BadRequest, to_api_error
from homeai.engine.errors import RequestError
from homeai.gateway.gateway import Gateway, Route
from homeai.gateway.metering import outcome_of

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
    # the API key's default class: where no header names one, it routes the requests of its kind (LLM or
    # embedding); one a policy change removed (or of the other kind) routes nothing, so the alias and the
    # user's default decide. Merged into ``class_name``, a removed one failed every request of the key with
    # "unknown class" naming a header the client never sent, and an LLM key's /v1/embeddings too.
    key_class: str | None = None


MAX_USER_CHARS = 64  # of a user name a keyless request gives (a Home Assistant conversation id is 26)


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
    if caller.keyless:  # not a key's user named "anonymous": that one could act as any user it named
        # cut: a name is a key of fairness counters and metrics labels, and a body's ``user`` may be megabytes
        user = (request.headers.get(HEADER_USER) or body_user or ANONYMOUS)[:MAX_USER_CHARS]
    timeout_ms = _int_header(request, HEADER_TIMEOUT_MS)
    return RequestContext(user=user, class_name=request.headers.get(HEADER_CLASS) or None,
                          priority_level=_int_header(request, HEADER_PRIORITY),
                          timeout_us=timeout_ms * 1000 if timeout_ms and timeout_ms > 0 else None,
                          key_class=key_class)


def normalize_model(model: str | None) -> str | None:
    """Ollama clients send ``name:latest``; we serve one version of each model."""
    if model and model.endswith(":latest"):
        return model[: -len(":latest")]
    return model or None


def key_class_for(gateway: Gateway, key_class: str | None, kind: str) -> str | None:
    """The key's default class where the policy has it for requests of ``kind``, else None."""
    cp = gateway.policy.classes.get(key_class) if key_class else None
    return key_class if cp is not None and cp.kind == kind else None


def route_request(gateway: Gateway, model: str | None, ctx: RequestContext, kind: str) -> Route:
    """Pick the class and model; a served model of the other kind (an LLM on /embeddings) is a 400, and
    so is a priority level the class does not have."""
    model = normalize_model(model)
    if model in gateway.llms and kind != "llm":
        raise BadRequest(f"model {model!r} is an LLM, not an embedding model", param="model")
    if model in gateway.embedders and kind != "embedding":
        raise BadRequest(f"model {model!r} is an embedding model, not an LLM", param="model")
    class_name = ctx.class_name or key_class_for(gateway, ctx.key_class, kind)
    try:
        route = gateway.route(model, class_name, kind, ctx.user)
    except RequestError as exc:  # the class: the header's when one was given, else the model's
        raise BadRequest(str(exc), param=HEADER_CLASS.lower() if ctx.class_name else "model") from None
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
    timeout_us = 0  # DELAY: a late request moves behind in its queue and never fails; nor while its model loads
    if qp.timeout_action == "REJECT":
        timeout_us = qp.default_timeout_microseconds
        if ctx.timeout_us and qp.allow_timeout_override:
            timeout_us = min(timeout_us, ctx.timeout_us) if timeout_us else ctx.timeout_us
    try:
        await gateway.ensure_llm(route.model, timeout_us / 1e6 if timeout_us else None, route.class_name,
                                 qp.max_queue_size)
    except Exception as exc:
        status = outcome_of(exc)
        if status in ("rejected", "timeout"):  # refused while the model loads: counted as a queue's refusal
            gateway.meter.refused(route.class_name, status)
        raise to_api_error(exc) from None


_NUM_CTX_WARNED: set[str] = set()  # models (a served model's name: bounded)


def warn_num_ctx(model: str, num_ctx: int, limit: int) -> None:
    """Ollama's ``options.num_ctx`` above the model's context: served in the model's own, as Ollama does, and
    logged once per model (a client sends the same on every request)."""
    if model not in _NUM_CTX_WARNED:
        _NUM_CTX_WARNED.add(model)
        log.warning("options.num_ctx %d is above model %s's context: served in its %d tokens", num_ctx, model, limit)


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
