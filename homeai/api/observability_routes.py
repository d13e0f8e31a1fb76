"""Observability: Prometheus metrics, the live stats the TUI draws, health and readiness.

    GET /metrics           Prometheus text (the recorder's series + engine gauges read now)
    GET /v1/stats          one JSON snapshot (shape in homeai.metrics.stats)
    GET /v1/stats/stream   the same as server-sent events (event "stats"), about twice a second
                           (``?count=N``: stop after N events)
    GET /healthz           the process answers: always {"status": "ok"}
    GET /readyz            200 "ready" once the gateway runs ("degraded" if the store does not answer, the
                           request log cannot write, or the policy file was refused at start-up),
                           503 "starting" before

Handlers receive the app's ``Services`` (homeai/api/services.py): the metrics recorder, the gateway
(``snapshot()``, ``ServingGateway``), the policy holder and, when present, the store and the request log;
``stats_interval_s`` is the stream's period.

Once API keys exist, stats and metrics (which name every household member) need a key with the
``metrics`` scope or an admin key (``opt["auth"]``, checked by the app's ``authenticate`` guard);
health and readiness stay public for probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Protocol

from litestar import Request, Response, Router, get
from litestar.exceptions import NotAuthorizedException, ServiceUnavailableException
from litestar.params import Parameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from prometheus_client import CONTENT_TYPE_LATEST

from homeai.api.auth import METRICS_SCOPE, presented_key, resolve_caller
from homeai.api.services import Injected, Services
from homeai.metrics.stats import build_stats
from homeai.runtime.device import process_rss_mb
from homeai.store.keys import KeyStoreUnavailable

log = logging.getLogger(__name__)


def _snapshot(services: Services) -> dict[str, Any] | None:
    gateway = services.gateway
    if gateway is None:
        return None
    try:
        return gateway.snapshot()
    except Exception:  # a half-started gateway must not take /metrics down with it
        log.exception("gateway snapshot failed")
        return None


def policy_status(services: Services) -> dict[str, Any]:
    """``{"status": "ok"}``, or the start-up refusal of the policy file while its fallback still runs."""
    refusal = services.policy_refusal
    if refusal is not None and refusal.is_current(services.policy_holder):
        return refusal.as_dict()
    return {"status": "ok"}


def stats_document(services: Services) -> dict[str, Any]:
    snap = _snapshot(services)
    doc = build_stats(services.metrics, snap, services.policy_holder.current)
    if snap is not None and "cluster" in snap:  # the nodes of ``homeai serve --cluster``
        doc["cluster"] = snap["cluster"]
    doc["policy"] = policy_status(services)  # the TUI shows a refused policy file from here
    # beside the models' memory budget and what they hold of it (the gateway's residency)
    doc["memory"] = {**doc.get("memory", {}), "rss_mb": process_rss_mb(),
                     "rss_at_ready_mb": getattr(services.gateway, "rss_at_ready_mb", None)}
    return doc


@get("/metrics", media_type=CONTENT_TYPE_LATEST, summary="Prometheus metrics", include_in_schema=False,
     opt={"auth": "metrics"})
async def metrics(services: Injected[Services]) -> Response[bytes]:
    return Response(services.metrics.prometheus_text(_snapshot(services)), media_type=CONTENT_TYPE_LATEST)


@get("/v1/stats", summary="Live per-class, per-user and device statistics", opt={"auth": "metrics"})
async def stats(services: Injected[Services]) -> dict[str, Any]:
    return stats_document(services)


async def _stats_events(services: Services, interval_s: float, count: int | None = None,
                        still_allowed: Callable[[], Awaitable[bool]] | None = None,
                        ) -> AsyncIterator[ServerSentEventMessage]:
    sent = 0
    while (count is None or sent < count) and not services.drain.draining:  # ends on SIGTERM
        if sent:
            await asyncio.sleep(interval_s)
            if still_allowed is not None and not await still_allowed():
                return  # its key was revoked: no more of every household member's figures
        yield ServerSentEventMessage(data=json.dumps(stats_document(services)), event="stats")
        sent += 1


def key_still_reads_metrics(request: Request[Any, Any, Any],
                            services: Services) -> Callable[[], Awaitable[bool]] | None:
    """Whether the stream's caller still may read the figures (checked before each event; the caller was
    checked once per request): a revoked key's open stream went on for good, and so did a keyless one
    opened while the server was open, after the first key closed it."""
    key, store = presented_key(request), services.store
    if store is None:
        return None

    async def allowed() -> bool:
        try:
            if key is None:  # keyless: allowed only while no key is needed
                return not services.settings.requires_keys and not await store.keys.has_active()
            info = await store.keys.verify(key)
        except KeyStoreUnavailable:
            return True  # the store is down a moment: the caller was let in, the next check decides
        return info is not None and (info.is_admin or METRICS_SCOPE in info.scopes)

    return allowed


# Not in the OpenAPI schema: an endless stream would hang schema-driven test clients (schemathesis).
@get("/v1/stats/stream", summary="Live statistics as server-sent events", include_in_schema=False,
     opt={"auth": "metrics"})
async def stats_stream(
    request: Request[Any, Any, Any], services: Injected[Services],
    count: Annotated[int | None, Parameter(ge=1, le=100_000)] = None,
) -> ServerSentEvent:
    """Events until the client goes away, its key is revoked, or ``count`` of them (``curl
    .../v1/stats/stream?count=1``)."""
    return ServerSentEvent(_stats_events(services, services.stats_interval_s, count,
                                         key_still_reads_metrics(request, services)),
                           headers={"Cache-Control": "no-store"})


@get("/healthz", summary="Liveness", opt={"auth": "public"})
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


class ServingGateway(Protocol):
    """What readiness reads of the gateway (a ``Gateway``; the route tests pass small fakes)."""

    @property
    def started_s(self) -> float: ...  # 0 until started

    @property
    def loop(self) -> object | None: ...  # the device loop; None before start and after shutdown

    def engine_health(self) -> dict[str, Any]: ...


def gateway_started(gateway: ServingGateway) -> bool:
    """Started and not shut down (a Gateway sets ``started_s`` on start and drops ``loop`` on shutdown)."""
    return bool(gateway.started_s) and gateway.loop is not None


async def may_read_details(request: Request[Any, Any, Any]) -> bool:
    """Whether a /readyz caller sees why (the policy file, its errors quoting household user names, the
    engine's last error, the models): a caller who may read statistics. Anyone else gets the status only."""
    try:
        return (await resolve_caller(request)).may_read_metrics()
    except (NotAuthorizedException, ServiceUnavailableException):
        return False


@get("/readyz", summary="Readiness (the reasons only for a caller who may read statistics)", opt={"auth": "public"})
async def readyz(request: Request[Any, Any, Any], services: Injected[Services]) -> Response[dict[str, Any]]:
    response = await _readiness(services)
    if response.content.keys() - {"status", "store"} and not await may_read_details(request):
        response.content = {k: v for k, v in response.content.items() if k in ("status", "store")}
    return response


async def _readiness(services: Services) -> Response[dict[str, Any]]:
    gateway = services.gateway
    drain = services.drain
    if drain.draining:  # a balancer stops sending here; requests get 503 anyway
        return Response({"status": "draining"}, status_code=503, headers={"Retry-After": str(drain.retry_after_s())})
    if gateway is None or not gateway_started(gateway):
        return Response({"status": "starting"}, status_code=503)
    health = gateway.engine_health()
    if health.get("failing"):  # steps keep failing: a supervisor should notice (and may restart us)
        return Response({"status": "failing", "reason": health.get("last_error")}, status_code=503)
    store = services.store
    store_state = "absent" if store is None else ("ok" if await store.ping() else "unavailable")
    writer = services.request_log  # the request-log writer: unhealthy while its writes fail
    if writer is not None and not writer.healthy and store_state == "ok":
        store_state = "slow"
    policy = policy_status(services)
    healthy = store_state in ("ok", "absent") and policy["status"] == "ok"
    body: dict[str, Any] = {"status": "ready" if healthy else "degraded", "store": store_state, "policy": policy}
    if policy["status"] != "ok":
        body["reason"] = policy["reason"]
    served = getattr(gateway, "served_models", None)
    if callable(served):
        body["models"] = served()
    return Response(body, status_code=200)


observability_router = Router(
    path="/",
    route_handlers=[metrics, stats, stats_stream, healthz, readyz],
    tags=["observability"],
)
