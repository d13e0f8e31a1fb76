"""The server's services in one typed object, and how handlers receive them.

``create_app`` builds one ``Services`` and keeps it in the app's state (``app_state``); the lifespans fill
the fields that appear during start-up (the store, the gateway, the request log, jobs and search) and set
them back to None when they stop. Nothing else reads ``app.state``:

- route handlers name what they need as parameters (``gateway: Injected[Gateway]``,
  ``store: Injected[Store | None]``, ...) and Litestar injects them from ``DEPENDENCIES``, which the app
  registers once;
- guards, lifespans and helpers that hold a connection or the app call ``services_of``.

``provide_gateway`` and ``provide_jobs`` answer 503 with Retry-After while what they provide is not there yet;
the others provide what is there, None included, and the handler decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from litestar import Litestar, Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import SkipValidation

from homeai.api.drain import Drain
from homeai.api.errors import ServiceUnavailable
from homeai.api.policy_startup import PolicyRefusal
from homeai.api.settings import Settings
from homeai.gateway.gateway import Gateway
from homeai.jobs.manager import JobManager
from homeai.metrics.recorder import MetricsRecorder
from homeai.policy.store import PolicyHolder
from homeai.search.matrix_cache import SearchIndex
from homeai.store.db import Store
from homeai.store.request_log import RequestLogWriter

T = TypeVar("T")
# A handler's or provider's parameter injected by its name (a key of DEPENDENCIES). Not validated per request:
# the value comes from the typed Services (whose fields msgspec could not even walk: they hold locks).
Injected: TypeAlias = NamedDependency[SkipValidation[T]]

SERVICES_KEY = "services"  # the one key of the app's state
STATS_INTERVAL_S = 0.5  # the live-stats stream's period
DRAIN_TIMEOUT_S = 30.0  # the drain of an app built without one (create_app uses Settings.drain_timeout_s)


@dataclass(slots=True)
class Services:
    """What the server runs on. The first fields exist from ``create_app`` on; the last ones are set by the
    lifespans (None before they start and after they stop, and where there is no store)."""

    settings: Settings
    policy_holder: PolicyHolder
    policy_path: Path | None = None  # the policy file: watched, and written by PUT /admin/policy (None: neither)
    policy_refusal: PolicyRefusal | None = None  # the file refused at start-up (/readyz, /v1/stats)
    metrics: MetricsRecorder = field(default_factory=MetricsRecorder)  # the gateway meters every request into it
    drain: Drain = field(default_factory=lambda: Drain(DRAIN_TIMEOUT_S))  # `homeai serve` begins it on SIGTERM
    stats_interval_s: float = STATS_INTERVAL_S
    # ---- set during start-up, in lifespan order (homeai/api/app.py, background.py)
    store: Store | None = None
    gateway: Gateway | None = None
    request_log: RequestLogWriter | None = None
    jobs: JobManager | None = None
    search: SearchIndex | None = None


def app_state(services: Services) -> State:
    """The app's state: the one ``Services`` (``Litestar(state=app_state(services), dependencies=DEPENDENCIES)``)."""
    return State({SERVICES_KEY: services})


def services_of(owner: Litestar | ASGIConnection[Any, Any, Any, Any]) -> Services:
    """The app's ``Services``, from the app or from a request (the one place that reads ``app.state``)."""
    app = owner if isinstance(owner, Litestar) else owner.app
    services = app.state.get(SERVICES_KEY)
    if not isinstance(services, Services):
        raise RuntimeError(f"the app has no Services in state[{SERVICES_KEY!r}] (build it with app_state)")
    return services


def started_gateway(services: Services) -> Gateway:
    """The running gateway; 503 with Retry-After while the engine is still starting."""
    if services.gateway is None:
        raise ServiceUnavailable("the engine is still starting", headers={"Retry-After": "5"})
    return services.gateway


# ---- Litestar dependency providers: a handler parameter named like the key receives the value -------------
def provide_services(request: Request[Any, Any, Any]) -> Services:
    return services_of(request)


def provide_settings(services: Injected[Services]) -> Settings:
    return services.settings


def provide_policy_holder(services: Injected[Services]) -> PolicyHolder:
    return services.policy_holder


def provide_policy_path(services: Injected[Services]) -> Path | None:
    return services.policy_path


def provide_store(services: Injected[Services]) -> Store | None:
    return services.store


def provide_gateway(services: Injected[Services]) -> Gateway:
    return started_gateway(services)


def provide_jobs(services: Injected[Services]) -> JobManager:
    if services.jobs is None:
        raise ServiceUnavailable("jobs are not available (no store, or still starting)", headers={"Retry-After": "5"})
    return services.jobs


DEPENDENCIES: dict[str, Provide] = {
    "services": Provide(provide_services, sync_to_thread=False),
    "settings": Provide(provide_settings, sync_to_thread=False),
    "policy_holder": Provide(provide_policy_holder, sync_to_thread=False),
    "policy_path": Provide(provide_policy_path, sync_to_thread=False),
    "store": Provide(provide_store, sync_to_thread=False),
    "gateway": Provide(provide_gateway, sync_to_thread=False),
    "jobs": Provide(provide_jobs, sync_to_thread=False),
}
