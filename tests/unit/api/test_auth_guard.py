"""The app-wide ``authenticate`` guard on the real routers, without a model.

A real Store on tmp SQLite holds the keys; no gateway is set, so a request that gets past the guard and
the body validation answers 503: every status below says which of those stages answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, Request, get
from litestar.testing import AsyncTestClient

from homeai.api.admin_routes import admin_router
from homeai.api.auth import authenticate
from homeai.api.errors import exception_handler
from homeai.api.jobs_routes import jobs_router
from homeai.api.json_depth import MAX_JSON_DEPTH, json_depth, too_deep
from homeai.api.observability_routes import observability_router
from homeai.api.ollama_routes import OllamaController, ollama_root
from homeai.api.openai_routes import OpenAIController
from homeai.api.routing import request_context
from homeai.api.services import DEPENDENCIES, Services, app_state
from homeai.api.settings import Settings
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
DEEP = b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * 1000 + b"]" * 1000 + b"}]}"


@pytest.fixture
async def client(store: Store, tmp_path: Path) -> AsyncIterator[AsyncTestClient[Litestar]]:
    services = Services(Settings(data_dir=tmp_path), PolicyHolder(load_policy(DEFAULT_POLICY)), store=store)
    app = Litestar(route_handlers=[OpenAIController, OllamaController, ollama_root, admin_router,
                                   observability_router, jobs_router],
                   guards=[authenticate], exception_handlers={Exception: exception_handler},
                   state=app_state(services), dependencies=DEPENDENCIES)
    async with AsyncTestClient(app=app) as c:
        yield c


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_authentication_runs_before_body_validation(client: AsyncTestClient[Any], store: Store) -> None:
    assert (await client.post("/v1/chat/completions", json={})).status_code == 400  # no keys: anyone on loopback
    key, _ = await store.keys.create("alice")
    r = await client.post("/v1/chat/completions", json={})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert (await client.post("/api/chat", content=b"{not json")).status_code == 401
    assert (await client.post("/v1/embeddings", json={}, headers=bearer("hai_wrong"))).status_code == 401
    r = await client.post("/v1/chat/completions", json={}, headers=bearer(key))
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


async def test_stats_and_metrics_need_the_metrics_scope_once_keys_exist(client: AsyncTestClient[Any],
                                                                       store: Store) -> None:
    for path in ("/v1/stats", "/metrics", "/v1/stats/stream?count=1"):
        assert (await client.get(path)).status_code == 200, path  # no keys on loopback: open
    plain, _ = await store.keys.create("kid", user="kids")
    watcher, info = await store.keys.create("tui", user="dad", scopes=["metrics"])
    admin, _ = await store.keys.create("root", is_admin=True)
    assert info.scopes == ("metrics",)
    for path in ("/v1/stats", "/metrics", "/v1/stats/stream?count=1"):
        assert (await client.get(path)).status_code == 401, path
        assert (await client.get(path, headers=bearer(plain))).status_code == 403, path
        assert (await client.get(path, headers=bearer(watcher))).status_code == 200, path
        assert (await client.get(path, headers=bearer(admin))).status_code == 200, path
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 503  # public: it answers "starting", not 401
    assert (await client.get("/")).status_code == 200  # Ollama's "is it running" probe


async def test_pull_and_jobs_need_an_admin(client: AsyncTestClient[Any], store: Store) -> None:
    plain, _ = await store.keys.create("kid", user="kids", scopes=["metrics"])
    admin, _ = await store.keys.create("root", is_admin=True)
    assert (await client.post("/api/pull", json={"model": "x"})).status_code == 401
    assert (await client.post("/api/pull", json={"model": "x"}, headers=bearer(plain))).status_code == 403
    assert (await client.post("/api/pull", json={"model": "x"}, headers=bearer(admin))).status_code == 503
    assert (await client.get("/v1/jobs", headers=bearer(plain))).status_code == 403
    assert (await client.post("/v1/jobs", json={}, headers=bearer(plain))).status_code == 403
    assert (await client.get("/v1/jobs", headers=bearer(admin))).status_code == 503  # no job manager here


async def test_deep_json_is_a_400_not_a_recursion_error(client: AsyncTestClient[Any], store: Store) -> None:
    for path in ("/v1/chat/completions", "/api/chat", "/v1/embeddings", "/admin/policy/rollback"):
        r = await client.post(path, content=DEEP, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        assert f"more than {MAX_JSON_DEPTH} levels" in r.text, r.text
    key, _ = await store.keys.create("alice")
    assert (await client.post("/v1/chat/completions", content=DEEP)).status_code == 401  # auth first
    r = await client.post("/v1/chat/completions", content=DEEP,
                          headers={**bearer(key), "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"


def test_json_depth_ignores_brackets_inside_strings() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[[{{{{"}], "c": "\\"[[["}') == 3
    assert not too_deep(b'"' + b"[" * 1000 + b'"')
    assert too_deep(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
    assert not too_deep(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)


def test_an_unterminated_string_ends_the_scan_in_one_pass() -> None:
    """A malformed body whose last string never closes: what follows its quote is text, not brackets, and
    the scan takes it once (requiring the closing quote made every quote a new start that scanned to the
    end: ``["\"\"\"...`` of 80 KB held the event loop 20 s)."""
    assert json_depth(b'{"a": ["' + b"[" * 100) == 2
    assert json_depth(b'["abc\\') == 1  # ends in a lone backslash
    body = b'{"model": "m", "messages": ' + b"[" * 65 + b'"' + b'\\"' * 30_000  # 90 KB: 25 s before, a millisecond now
    assert json_depth(body) == 66


@get("/who", sync_to_thread=False)
async def who(request: Request[Any, Any, Any]) -> dict[str, str]:
    return {"user": (await request_context(request, body_user="bob")).user}


async def test_only_a_request_without_a_key_names_its_user(store: Store, tmp_path: Path) -> None:
    """The context trusted the header or body user whenever the caller's user was "anonymous": a key made
    for a user of that name (``homeai keys create anonymous``) acted as any user it named, with that
    user's classes and fair share. Such a key can no longer be made; one made before keeps its own user."""
    from sqlalchemy import update

    from homeai.store.keys import KeyStoreError
    from homeai.store.tables import ApiKeyRow, UserRow

    with pytest.raises(KeyStoreError, match="anonymous"):
        await store.keys.create("anonymous")
    kids, _ = await store.keys.create("kids-tablet", user="kids")
    old, _ = await store.keys.create("guest")
    assert store.sessions is not None
    async with store.sessions.begin() as session:  # a key made before the refusal
        session.add(UserRow(name="anonymous"))
        await session.flush()
        await session.execute(update(ApiKeyRow).where(ApiKeyRow.name == "guest").values(user="anonymous"))
    services = Services(Settings(data_dir=tmp_path, host="0.0.0.0"), PolicyHolder(load_policy(DEFAULT_POLICY)),
                        store=store)
    app = Litestar(route_handlers=[who], guards=[authenticate], exception_handlers={Exception: exception_handler},
                   state=app_state(services), dependencies=DEPENDENCIES)
    async with AsyncTestClient(app=app) as c:
        for key, user in ((kids, "kids"), (old, "anonymous")):
            r = await c.get("/who", headers={**bearer(key), "X-HomeAI-User": "alice"})
            assert r.json() == {"user": user}, r.text
    services = Services(Settings(data_dir=tmp_path / "keyless"), PolicyHolder(load_policy(DEFAULT_POLICY)))
    app = Litestar(route_handlers=[who], guards=[authenticate], exception_handlers={Exception: exception_handler},
                   state=app_state(services), dependencies=DEPENDENCIES)
    async with AsyncTestClient(app=app) as c:  # loopback, no store, no key: the request names its user
        assert (await c.get("/who", headers={"X-HomeAI-User": "alice"})).json() == {"user": "alice"}
        assert (await c.get("/who")).json() == {"user": "bob"}
        # cut to 64 characters: a name keys fairness counters and metrics labels (a review found a body's
        # ``user`` of megabytes kept for good)
        assert (await c.get("/who", headers={"X-HomeAI-User": "x" * 5000})).json() == {"user": "x" * 64}


async def test_a_revoked_key_ends_its_open_stats_stream(store: Store, tmp_path: Path) -> None:
    """The caller was checked once per request: a metrics key revoked (say, leaked) while its stream was
    open went on receiving every household member's figures for as long as it stayed connected. (The
    test client reads a stream only once it has ended, so the events are drawn from the route's generator.)"""
    from types import SimpleNamespace

    from homeai.api.observability_routes import _stats_events, key_still_reads_metrics

    services = Services(Settings(data_dir=tmp_path), PolicyHolder(load_policy(DEFAULT_POLICY)), store=store)
    await store.keys.create("root", is_admin=True)
    key, _ = await store.keys.create("grafana", scopes=["metrics"])
    request = SimpleNamespace(headers={"authorization": f"Bearer {key}"})
    events = _stats_events(services, 0.001, 200, key_still_reads_metrics(request, services))  # type: ignore[arg-type]
    received = [await anext(events), await anext(events)]
    await store.keys.revoke("grafana")
    received += [e async for e in events]
    assert len(received) == 2


async def test_a_keyless_stats_stream_ends_when_the_first_key_is_made(store: Store, tmp_path: Path) -> None:
    """Opened while the loopback server was open (no key yet): the first ``homeai keys create`` closes the
    server to keyless requests, and before, the open stream went on sending every member's figures."""
    from types import SimpleNamespace

    from homeai.api.observability_routes import _stats_events, key_still_reads_metrics

    services = Services(Settings(data_dir=tmp_path), PolicyHolder(load_policy(DEFAULT_POLICY)), store=store)
    request = SimpleNamespace(headers={})
    events = _stats_events(services, 0.001, 200, key_still_reads_metrics(request, services))  # type: ignore[arg-type]
    received = [await anext(events), await anext(events)]
    await store.keys.create("root", is_admin=True)
    received += [e async for e in events]
    assert len(received) == 2


async def test_a_loopback_server_behind_a_proxy_needs_keys(store: Store, tmp_path: Path) -> None:
    """Bound to 127.0.0.1 behind a reverse proxy on the same box (its LAN name in HOMEAI_ALLOWED_HOSTS), with
    no key made yet: every LAN device was an anonymous admin (PUT /admin/policy, an index job over the home
    folder, then /v1/search). Found by a security review."""
    behind_proxy = Settings(data_dir=tmp_path, host="127.0.0.1", allowed_hosts=("ai.home.lan",))
    assert behind_proxy.requires_keys
    assert not Settings(data_dir=tmp_path, host="127.0.0.1", allowed_hosts=()).requires_keys
    services = Services(Settings(data_dir=tmp_path, host="127.0.0.1", allowed_hosts=()),
                        PolicyHolder(load_policy(DEFAULT_POLICY)), store=store)
    app = Litestar(route_handlers=[admin_router], guards=[authenticate],
                   exception_handlers={Exception: exception_handler}, state=app_state(services),
                   dependencies=DEPENDENCIES)
    async with AsyncTestClient(app=app) as c:  # no allowed name, but the proxy says where the request came from
        for header in ({"X-Forwarded-For": "192.168.1.50"}, {"Forwarded": "for=192.168.1.50"}):
            assert (await c.get("/admin/policy", headers=header)).status_code == 401, header
        assert (await c.get("/admin/policy")).status_code == 200  # this box's own keyless caller
