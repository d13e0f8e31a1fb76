"""Observability: Prometheus metrics, the live stats the TUI draws, health and readiness.

    GET /metrics           Prometheus text (the recorder's series + engine gauges read now)
    GET /v1/stats          one JSON snapshot (shape in homeai.metrics.stats)
    GET /v1/stats/stream   the same as server-sent events (event "stats"), about twice a second
                           (``?count=N``: stop after N events)
    GET /healthz           the process answers: always {"status": "ok"}
    GET /readyz            200 "ready" once the gateway runs ("degraded" if the store does not answer, the
                           request log cannot write, or the policy file was refused at start-up),
                           503 "starting" before

Uses ``app.state.metrics`` (a MetricsRecorder), ``app.state.gateway`` (``snapshot()``, ``ServingGateway``),
``app.state.policy_holder`` and ``app.state.store`` when present; ``app.state.stats_interval_s``
overrides the stream period.

Once API keys exist, stats and metrics (which name every household member) need a key with the
``metrics`` scope or an admin key (``opt["auth"]``, checked by the app's ``authenticate`` guard);
health and readiness stay public for probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Protocol

from litestar import Request, Response, Router, get
from litestar.datastructures import State
from litestar.params import Parameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from prometheus_client import CONTENT_TYPE_LATEST

from homeai.metrics.recorder import MetricsRecorder
from homeai.metrics.stats import build_stats
from homeai.runtime.device import process_rss_mb

log = logging.getLogger(__name__)

DEFAULT_STATS_INTERVAL_S = 0.5


def _snapshot(state: State) -> dict[str, Any] | None:
    gateway = state.get("gateway")
    if gateway is None:
        return None
    try:
        return gateway.snapshot()
    except Exception:  # a half-started gateway must not take /metrics down with it
        log.exception("gateway snapshot failed")
        return None


def _recorder(state: State) -> MetricsRecorder:
    recorder = state.get("metrics")
    if recorder is None:  # an app without a recorder still answers (empty series)
        recorder = state["metrics"] = MetricsRecorder()
    return recorder


def policy_status(state: State) -> dict[str, Any]:
    """``{"status": "ok"}``, or the start-up refusal of the policy file while its fallback still runs."""
    holder = state.get("policy_holder")
    refusal = state.get("policy_refusal")
    if refusal is not None and holder is not None and refusal.is_current(holder):
        return refusal.as_dict()
    return {"status": "ok"}


def stats_document(state: State) -> dict[str, Any]:
    holder = state.get("policy_holder")
    doc = build_stats(_recorder(state), _snapshot(state), holder.current if holder is not None else None)
    doc["policy"] = policy_status(state)  # the TUI shows a refused policy file from here
    gateway = state.get("gateway")
    # beside the models' memory budget and what they hold of it (the gateway's residency)
    doc["memory"] = {**doc.get("memory", {}), "rss_mb": process_rss_mb(),
                     "rss_at_ready_mb": getattr(gateway, "rss_at_ready_mb", None)}
    return doc


@get("/metrics", media_type=CONTENT_TYPE_LATEST, summary="Prometheus metrics", include_in_schema=False,
     opt={"auth": "metrics"})
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    state = request.app.state
    return Response(_recorder(state).prometheus_text(_snapshot(state)), media_type=CONTENT_TYPE_LATEST)


@get("/v1/stats", summary="Live per-class, per-user and device statistics", opt={"auth": "metrics"})
async def stats(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return stats_document(request.app.state)


async def _stats_events(state: State, interval_s: float, count: int | None = None,
                        ) -> AsyncIterator[ServerSentEventMessage]:
    sent = 0
    drain = state.get("drain")
    while (count is None or sent < count) and not (drain is not None and drain.draining):  # ends on SIGTERM
        if sent:
            await asyncio.sleep(interval_s)
        yield ServerSentEventMessage(data=json.dumps(stats_document(state)), event="stats")
        sent += 1


# Not in the OpenAPI schema: an endless stream would hang schema-driven test clients (schemathesis).
@get("/v1/stats/stream", summary="Live statistics as server-sent events", include_in_schema=False,
     opt={"auth": "metrics"})
async def stats_stream(
    request: Request[Any, Any, Any], count: Annotated[int | None, Parameter(ge=1, le=100_000)] = None,
) -> ServerSentEvent:
    """Events until the client goes away, or ``count`` of them (``curl .../v1/stats/stream?count=1``)."""
    state = request.app.state
    interval_s = float(state.get("stats_interval_s", DEFAULT_STATS_INTERVAL_S))
    return ServerSentEvent(_stats_events(state, interval_s, count), headers={"Cache-Control": "no-store"})


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


@get("/readyz", summary="Readiness", opt={"auth": "public"})
async def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    state = request.app.state
    gateway: ServingGateway | None = state.get("gateway")
    drain = state.get("drain")
    if drain is not None and drain.draining:  # a balancer stops sending here; requests get 503 anyway
        return Response({"status": "draining"}, status_code=503, headers={"Retry-After": str(drain.retry_after_s())})
    if gateway is None or not gateway_started(gateway):
        return Response({"status": "starting"}, status_code=503)
    health = gateway.engine_health()
    if health.get("failing"):  # steps keep failing: a supervisor should notice (and may restart us)
        return Response({"status": "failing", "reason": health.get("last_error")}, status_code=503)
    store = state.get("store")
    store_state = "absent" if store is None else ("ok" if await store.ping() else "unavailable")
    writer = state.get("request_log")  # the request-log writer: unhealthy while its writes fail
    if writer is not None and not writer.healthy and store_state == "ok":
        store_state = "slow"
    policy = policy_status(state)
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
