"""The composition root: ``create_app(settings)`` wires routes, error mapping, services and lifespans.

Lifespans start services in order and stop them in reverse: the store (SQLite in the data dir), the
engine (``Gateway.start`` loads models, which blocks, so it runs in a worker thread: the event loop
never waits on the device), then the policy-file watcher; each keeps what it starts in the app's one
``Services`` (homeai/api/services.py), which handlers receive through Litestar's dependency injection. The
admin, observability, jobs and key parts are built by their own modules and registered here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn

from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin

from homeai.api.admin_routes import admin_router
from homeai.api.auth import authenticate
from homeai.api.background import background_lifespan
from homeai.api.collections_routes import collections_router
from homeai.api.drain import Drain, end_open_generations, refuse_while_draining
from homeai.api.errors import exception_handler
from homeai.api.jobs_routes import jobs_router
from homeai.api.observability_routes import observability_router
from homeai.api.ollama_routes import OllamaController, ollama_root, ollama_root_head
from homeai.api.openai_routes import OpenAIController
from homeai.api.origin_guard import web_protection
from homeai.api.policy_apply import record_running_policy, use_catalog
from homeai.api.policy_startup import fall_back_to_stored, startup_catalog, startup_holder
from homeai.api.policy_watcher import start_policy_watcher
from homeai.api.responses_routes import ResponsesController
from homeai.api.services import DEPENDENCIES, Services, app_state, services_of
from homeai.api.settings import Settings
from homeai.gateway.gateway import Gateway, GatewayConfig
from homeai.gateway.metering import Meter
from homeai.store.db import Store

log = logging.getLogger(__name__)


def exit_after_failed_start(what: str, exc: BaseException, hint: str = "") -> NoReturn:
    """``homeai serve``'s end when a service cannot start: one line and exit 1 (under systemd a traceback was
    repeated every restart). ``os._exit``: the lifespan's caller would turn a raise into a traceback."""
    log.debug("the start failed", exc_info=exc)
    if isinstance(exc, SystemExit):  # its message is the whole story
        cause = str(exc.code)
    else:
        first = str(exc).splitlines()[0] if str(exc) else ""
        cause = f"{type(exc).__name__}: {first}"
    # its own line: the log's records go out through a queue, and one may be half written now
    print(f"\nerror: {what}: {cause}{hint}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(1)


@asynccontextmanager
async def store_lifespan(app: Litestar) -> AsyncIterator[None]:
    """SQLite (users, keys, request log, policy versions); the running policy is recorded once. After
    a refused policy file, the newest valid stored version replaces the packaged default first."""
    services = services_of(app)
    settings = services.settings
    try:
        store = Store(settings.database_url) if settings.database_url else Store.in_dir(settings.data_dir)
        await store.init()
    except Exception as exc:  # a database that is down or refuses us: one line under `homeai serve`
        if not settings.exit_on_start_failure:
            raise
        exit_after_failed_start("cannot open the database", exc)
    services.store = store
    try:
        if services.policy_refusal is not None:
            await fall_back_to_stored(services.policy_holder, store, services.policy_refusal)
        await record_running_policy(services.policy_holder, store)
    except Exception:
        log.exception("could not record the running policy in the store")
    try:
        yield
    finally:
        services.store = None
        await store.close()


@asynccontextmanager
async def engine_lifespan(app: Litestar) -> AsyncIterator[None]:
    """Load the policy's models and start the device loop (in a thread: loading blocks for seconds)."""
    services = services_of(app)
    settings = services.settings
    config = GatewayConfig(cache_dir=settings.cache_dir, device=settings.device, kv_cache_mb=settings.kv_cache_mb,
                           compile_decode=settings.compile_decode)
    loop = asyncio.get_running_loop()
    stop_cluster: Callable[[], None] | None = None
    gateway: Gateway
    if settings.cluster:  # only then is Ray imported
        from homeai.cluster.front_door import cluster_gateway

        try:  # a bad address, no Ray, no token, a head that does not come up (SystemExit from connect)
            gateway, stop_cluster = await loop.run_in_executor(
                None, cluster_gateway, settings.cluster, settings.data_dir, services.policy_holder, config,
                Meter(services.metrics))
        except (Exception, SystemExit) as exc:
            if not settings.exit_on_start_failure:
                raise
            exit_after_failed_start("cannot start the cluster", exc)
    else:
        gateway = Gateway(services.policy_holder, config, meter=Meter(services.metrics))  # meters every submission
    try:
        await loop.run_in_executor(None, gateway.start)
    except Exception as exc:
        if stop_cluster is not None:  # the head is ours: left running, the next start attached to the orphan
            await loop.run_in_executor(None, stop_cluster)
        if not settings.exit_on_start_failure:
            raise
        exit_after_failed_start("cannot start", exc, " (a damaged model is pulled again by `homeai pull --force NAME`)")
    services.gateway = gateway
    use_catalog(services.policy_holder, gateway.catalog)  # new policies: against what is pulled and fits
    log.info("serving %s on http://%s:%d", ", ".join(gateway.served_models()), settings.host, settings.port)
    try:
        yield
    finally:
        services.gateway = None
        await loop.run_in_executor(None, gateway.shutdown)
        if stop_cluster is not None:
            await loop.run_in_executor(None, stop_cluster)


@asynccontextmanager
async def drain_lifespan(app: Litestar) -> AsyncIterator[None]:
    """Arm the drain (``homeai serve`` calls ``begin`` on SIGTERM): at its deadline, the gateway's open
    generations are ended with an error that each stream turns into its API's final message."""
    services = services_of(app)
    services.drain.attach(asyncio.get_running_loop(), lambda: end_open_generations(services.gateway))
    try:
        yield
    finally:
        services.drain.close()


@asynccontextmanager
async def policy_watcher_lifespan(app: Litestar) -> AsyncIterator[None]:
    """Hot reload: an edited policy file is applied; an invalid one is refused and logged."""
    services = services_of(app)
    if services.policy_path is None:  # nothing to watch
        yield
        return
    task = start_policy_watcher(services.policy_holder, services.policy_path, services.store,
                                services.settings.policy_poll_s)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


ROUTE_HANDLERS: list[Any] = [OpenAIController, ResponsesController, OllamaController, ollama_root, ollama_root_head,
                             admin_router, observability_router, jobs_router, collections_router]


def protection(settings: Settings) -> dict[str, Any]:
    """What every request passes before its handler, as Litestar arguments (tests build apps with them)."""
    return {
        "exception_handlers": {Exception: exception_handler},
        # first of all: a request must name this server, and a browser's must come from an allowed page
        **web_protection(settings),
        # before any body is parsed: a draining server answers 503, a stranger 401 (never a 400), then the
        # body's media type, depth and types (homeai/api/body_guard.py)
        "guards": [refuse_while_draining, authenticate],
        "request_max_body_size": settings.max_body_bytes,  # a larger body: 413, unread if its length is sent
    }


def create_app(settings: Settings | None = None) -> Litestar:
    """Build the app; the policy is read here. An invalid file is refused (logged, reported by /readyz)
    and the server starts on a fallback policy rather than not at all."""
    settings = settings or Settings()
    policy_path = settings.prepare_data_dir()
    holder, refusal = startup_holder(policy_path, startup_catalog(settings))
    services = Services(settings, holder, policy_path=policy_path, policy_refusal=refusal,
                        drain=Drain(settings.drain_timeout_s))
    return Litestar(
        route_handlers=ROUTE_HANDLERS,
        **protection(settings),
        # request log and jobs start after the engine and stop before it
        lifespan=[store_lifespan, engine_lifespan, background_lifespan, drain_lifespan, policy_watcher_lifespan],
        state=app_state(services),  # the lifespans fill in what they start
        dependencies=DEPENDENCIES,  # handlers name the services they need (homeai/api/services.py)
        openapi_config=OpenAPIConfig(title="HomeAI Gateway", version="0.1.0", path="/schema",
                                     render_plugins=[SwaggerRenderPlugin()]),
    )
