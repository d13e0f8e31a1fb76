"""The composition root: ``create_app(settings)`` wires routes, error mapping, state and lifespans.

Lifespans start services in order and stop them in reverse: the store (SQLite in the data dir), the
engine (``Gateway.start`` loads models, which blocks, so it runs in a worker thread: the event loop
never waits on the device), then the policy-file watcher. The admin, observability and key parts are
built by their own modules and registered here when present.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, get
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin

from homeai.api.errors import exception_handler
from homeai.api.ollama_routes import OllamaController, ollama_root, ollama_root_head
from homeai.api.openai_routes import OpenAIController
from homeai.api.responses_routes import ResponsesController
from homeai.api.settings import Settings
from homeai.engine.gateway import Gateway, GatewayConfig
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder

log = logging.getLogger(__name__)


def _optional(module: str, name: str) -> Any:
    """An attribute of a sibling part's module, or None while that part does not exist yet.

    Only a missing module is tolerated: a module that exists but fails to import fails the start.
    """
    if importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), name)


@get("/v1/debug/engine", summary="Engine snapshot (only while the observability routes are absent)")
async def debug_engine(request: Request[Any, Any, Any]) -> dict[str, Any]:
    gateway = request.app.state.get("gateway")
    return gateway.snapshot() if gateway is not None else {}


@asynccontextmanager
async def store_lifespan(app: Litestar) -> AsyncIterator[None]:
    """SQLite (users, keys, request log, policy versions); the running policy is recorded once."""
    store_cls = _optional("homeai.store.db", "Store")
    if store_cls is None:
        yield
        return
    settings = app.state.settings
    url = getattr(settings, "database_url", None)
    store = store_cls(url) if url else store_cls.in_dir(settings.data_dir)
    await store.init()
    app.state.store = store
    record = _optional("homeai.api.policy_apply", "record_running_policy")
    if record is not None:
        try:
            await record(app.state.policy_holder, store)
        except Exception:
            log.exception("could not record the running policy in the store")
    try:
        yield
    finally:
        app.state.store = None
        await store.close()


@asynccontextmanager
async def engine_lifespan(app: Litestar) -> AsyncIterator[None]:
    """Load the policy's models and start the device loop (in a thread: loading blocks for seconds)."""
    settings: Settings = app.state.settings
    config = GatewayConfig(cache_dir=settings.cache_dir, device=settings.device, kv_cache_mb=settings.kv_cache_mb)
    gateway = Gateway(app.state.policy_holder, config)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, gateway.start)
    app.state.gateway = gateway
    log.info("serving %s on http://%s:%d", ", ".join(gateway.served_models()), settings.host, settings.port)
    try:
        yield
    finally:
        app.state.gateway = None
        await loop.run_in_executor(None, gateway.shutdown)


@asynccontextmanager
async def policy_watcher_lifespan(app: Litestar) -> AsyncIterator[None]:
    """Hot reload: an edited policy file is applied; an invalid one is refused and logged."""
    start = _optional("homeai.api.policy_watcher", "start_policy_watcher")
    if start is None:
        yield
        return
    task = start(app.state.policy_holder, app.state.policy_path, app.state.get("store"),
                 app.state.settings.policy_poll_s)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def create_app(settings: Settings | None = None) -> Litestar:
    """Build the app; the policy is read here, so an invalid one fails before anything starts."""
    settings = settings or Settings()
    policy_path = settings.prepare_data_dir()
    text = policy_path.read_text(encoding="utf-8")
    holder = PolicyHolder(load_policy(policy_path), source=str(policy_path))
    remember = _optional("homeai.api.policy_apply", "remember_text")
    if remember is not None:
        remember(holder, text)
    recorder_cls = _optional("homeai.metrics.recorder", "MetricsRecorder")
    handlers: list[Any] = [OpenAIController, ResponsesController, OllamaController, ollama_root, ollama_root_head]
    for module, name in (("homeai.api.admin_routes", "admin_router"),
                         ("homeai.api.observability_routes", "observability_router"),
                         ("homeai.api.jobs_routes", "jobs_router")):
        router = _optional(module, name)
        if router is not None:
            handlers.append(router)
    if _optional("homeai.api.observability_routes", "observability_router") is None:
        handlers.append(debug_engine)
    return Litestar(
        route_handlers=handlers,
        exception_handlers={Exception: exception_handler},
        lifespan=[store_lifespan, engine_lifespan, *_lifespans(("homeai.api.background", "background_lifespan")),
                  policy_watcher_lifespan],
        request_max_body_size=settings.max_body_bytes,
        state=_state(settings, holder, policy_path, recorder_cls() if recorder_cls else None),
        openapi_config=OpenAPIConfig(title="HomeAI Gateway", version="0.1.0", path="/schema",
                                     render_plugins=[SwaggerRenderPlugin()]),
    )


def _lifespans(*names: tuple[str, str]) -> list[Any]:
    """The lifespans of parts that exist (request log and jobs: after the engine, stopped before it)."""
    return [found for module, name in names if (found := _optional(module, name)) is not None]


def _state(settings: Settings, holder: PolicyHolder, policy_path: Any, metrics: Any) -> Any:
    from litestar.datastructures import State

    return State({"settings": settings, "bind_host": settings.host, "policy_holder": holder,
                  "policy_path": policy_path, "metrics": metrics, "gateway": None, "store": None})
