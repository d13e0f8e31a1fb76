"""Who is calling: an API key gives the user, a default class and the admin flag.

Keys are required once any key exists, or whenever the server listens on a non-loopback address
(``Settings.requires_keys``). Without keys on loopback every caller is ``anonymous`` and an admin: a
single-machine household needs no setup. A key comes as ``Authorization: Bearer KEY`` (what the openai
and ollama clients send) or ``X-API-Key: KEY``.

``authenticate`` is the app's guard on every route: guards run before Litestar parses a body, so an
unauthenticated request gets 401 whatever its body holds (and an oversized, over-nested or mistyped
body is never read for a stranger). A route's ``opt["auth"]`` says what it needs: ``public`` (health, the
Ollama root probe), ``metrics`` (stats and /metrics name every household member: a key with the
``metrics`` scope, or an admin), ``admin``; anything else needs any authenticated caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException, ServiceUnavailableException
from litestar.handlers.base import BaseRouteHandler

from homeai.api.body_guard import check_body
from homeai.api.services import services_of
from homeai.store.keys import KeyStoreUnavailable

ANONYMOUS = "anonymous"
METRICS_SCOPE = "metrics"
_CALLER_STATE_KEY = "homeai_caller"
PUBLIC, METRICS, ADMIN = "public", "metrics", "admin"  # values of a route's opt["auth"]
PUBLIC_PREFIXES = ("/schema",)  # the OpenAPI document: Litestar's own routes carry no opt


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller. ``user`` is ``anonymous`` when no key was needed nor given (``keyless``:
    only then may the request name its user, by header or body; a key's user is the key's)."""

    user: str
    default_class: str | None
    is_admin: bool
    scopes: frozenset[str] = frozenset()
    keyless: bool = False

    def may_read_metrics(self) -> bool:
        return self.is_admin or METRICS_SCOPE in self.scopes


def presented_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The key in ``Authorization: Bearer ...`` or ``X-API-Key``, if any."""
    header = connection.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    value = connection.headers.get("x-api-key", "").strip()
    return value or None


def forwarded(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    """A reverse proxy's mark (``Forwarded``, ``X-Forwarded-For``): the request came from elsewhere."""
    return "forwarded" in connection.headers or "x-forwarded-for" in connection.headers


async def resolve_caller(connection: ASGIConnection[Any, Any, Any, Any]) -> Caller:
    """Authenticate the request (401 when a key is needed and missing or wrong; 503 if the keys
    cannot be read). The result is kept on the request, so calling it twice costs nothing."""
    cached = connection.state.get(_CALLER_STATE_KEY)
    if isinstance(cached, Caller):
        return cached
    services = services_of(connection)
    store = services.store
    key = presented_key(connection)
    try:
        info = await store.keys.verify(key) if store is not None and key else None
        # beyond loopback keys are mandatory, even before any exists; so they are for a request a proxy
        # forwarded (it came from another machine, though to a loopback address)
        required = services.settings.requires_keys or forwarded(connection) or (
            store is not None and await store.keys.has_active())
    except KeyStoreUnavailable as e:
        raise ServiceUnavailableException("API keys are unavailable (the store cannot be read)") from e
    if info is not None:
        caller = Caller(info.user, info.default_class, info.is_admin, frozenset(info.scopes))
    elif required:
        detail = "invalid API key" if key else "an API key is required (Authorization: Bearer KEY)"
        raise NotAuthorizedException(detail, headers={"WWW-Authenticate": "Bearer"})
    else:
        caller = Caller(ANONYMOUS, None, True, keyless=True)
    connection.state[_CALLER_STATE_KEY] = caller
    return caller


async def require_admin(connection: ASGIConnection[Any, Any, Any, Any], _handler: BaseRouteHandler) -> None:
    """Litestar guard: an admin key (or no keys at all on loopback), else 401/403."""
    caller = await resolve_caller(connection)
    if not caller.is_admin:
        raise PermissionDeniedException(f"user {caller.user!r} is not an admin")


async def authenticate(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """The app-wide guard: who is calling, checked against the route's ``opt["auth"]``, then the body's
    media type, JSON depth and types (``homeai.api.body_guard``: a caller who may not use the route never
    has its body read)."""
    needs = handler.opt.get("auth")
    if needs == PUBLIC or connection.scope["path"].startswith(PUBLIC_PREFIXES):
        return
    caller = await resolve_caller(connection)
    if needs == ADMIN and not caller.is_admin:
        raise PermissionDeniedException(f"user {caller.user!r} is not an admin")
    if needs == METRICS and not caller.may_read_metrics():
        raise PermissionDeniedException(f"user {caller.user!r} needs a key with the {METRICS_SCOPE!r} scope "
                                        "or an admin key to read statistics")
    await check_body(connection, handler)
