"""Safe against web pages. The server as shipped (loopback, no keys) must not be driven by a page
that a household member happens to open, and what it refuses it refuses with a clean 4xx.

The app is built with the routes and the protection ``create_app`` uses (``ROUTE_HANDLERS``,
``protection``), a real Store on tmp SQLite and the default policy, and no gateway: a request that passes
every check answers 503 ("the engine is still starting"), so 503 below means "let through". The headers are
what browsers send (Chrome 126: a ``fetch`` with a string body, a form post, a DNS-rebound page).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from homeai.api.app import ROUTE_HANDLERS, protection
from homeai.api.drain import Drain
from homeai.api.origin_guard import WebOrigins, host_name
from homeai.api.services import DEPENDENCIES, Services, app_state
from homeai.api.settings import Settings
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
CHAT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "turn off the alarm"}]}
BASE = "http://127.0.0.1:8000"
UA = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 "
      "Safari/537.36")
EVIL = "https://evil.example"


def fetch_from(origin: str, site: str = "cross-site", content_type: str = "text/plain;charset=UTF-8"
               ) -> dict[str, str]:
    """``fetch(url, {method: "POST", body: JSON.stringify(...)})`` from a page at ``origin``: a "simple"
    request (text/plain), sent without a preflight."""
    return {"Origin": origin, "Content-Type": content_type, "User-Agent": UA, "Accept": "*/*",
            "Sec-Fetch-Site": site, "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Referer": origin + "/"}


def form_post_from(origin: str) -> dict[str, str]:
    """``<form method=post action=http://127.0.0.1:8000/...>`` submitted by a page at ``origin``."""
    return {"Origin": origin, "Content-Type": "application/x-www-form-urlencoded", "User-Agent": UA,
            "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document",
            "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def make_app(store: Store, settings: Settings) -> Litestar:
    services = Services(settings, PolicyHolder(load_policy(DEFAULT_POLICY)), store=store, drain=Drain(30.0))
    return Litestar(route_handlers=ROUTE_HANDLERS, **protection(settings), state=app_state(services),
                    dependencies=DEPENDENCIES)


@pytest.fixture
async def client(store: Store, tmp_path: Path) -> AsyncIterator[AsyncTestClient[Litestar]]:
    settings = Settings(data_dir=tmp_path, job_roots=(tmp_path,), allowed_hosts=(), origins=())
    async with AsyncTestClient(app=make_app(store, settings), base_url=BASE) as c:
        yield c


# ---- 1. Host (DNS rebinding) ----------------------------------------------------------------------
async def test_a_rebound_name_is_refused(client: AsyncTestClient[Any]) -> None:
    """Before: a page on rebind.evil.example, its name re-resolved to 127.0.0.1, was served (it even counts
    as same-origin for the browser, so it could read the answers)."""
    rebound = {"Host": "rebind.evil.example:8000", "Origin": "http://rebind.evil.example:8000",
               "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "User-Agent": UA}
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/stats"), ("GET", "/api/tags"),
                         ("GET", "/admin/policy"), ("GET", "/v1/models")):
        r = await client.request(method, path, json=CHAT if method == "POST" else None, headers=rebound)
        assert r.status_code == 403, (path, r.text)
        assert "rebind.evil.example" in r.text and "HOMEAI_ALLOWED_HOSTS" in r.text
    r = await client.get("/api/tags", headers={"Host": "rebind.evil.example"})  # no Origin at all: a GET
    assert r.status_code == 403 and r.json() == {"error": r.json()["error"]}  # Ollama's error shape
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Host": "rebind.evil.example"})
    assert r.json()["error"]["code"] == "host_not_allowed"


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "127.0.0.2",
                                  "app.localhost:8000"])
async def test_the_servers_own_names_are_served(client: AsyncTestClient[Any], host: str) -> None:
    assert (await client.post("/v1/chat/completions", json=CHAT, headers={"Host": host})).status_code == 503


def test_which_hosts_are_this_server() -> None:
    addresses = {"192.168.1.20", "fe80::1"}
    loopback = WebOrigins("127.0.0.1", 8000, hostname="homeserver", addresses=lambda: addresses)
    for host in ("localhost", "127.0.0.1:8000", "[::1]:8000", "homeserver:8000", "HomeServer.local", ""):
        assert loopback.host_allowed(host), host
    for host in ("192.168.1.20:8000", "evil.example", "localhost.evil.example", "127.0.0.1.nip.io", "10.0.0.9"):
        assert not loopback.host_allowed(host), host
    anywhere = WebOrigins("0.0.0.0", 8000, hostname="homeserver", addresses=lambda: addresses)
    assert anywhere.host_allowed("192.168.1.20:8000") and anywhere.host_allowed("[fe80::1]:8000")
    assert not anywhere.host_allowed("10.0.0.9") and not anywhere.host_allowed("evil.example")
    bound = WebOrigins("192.168.1.20", 8000, hostname="homeserver", addresses=lambda: addresses)
    assert bound.host_allowed("192.168.1.20") and not bound.host_allowed("[fe80::1]")
    configured = WebOrigins("127.0.0.1", 8000, allowed_hosts=("homeai.lan", "Proxy.Example."), hostname="h")
    assert configured.host_allowed("homeai.lan:8000") and configured.host_allowed("proxy.example")
    assert not configured.host_allowed("evil.example")
    assert WebOrigins("127.0.0.1", 8000, allowed_hosts=("*",)).host_allowed("anything.example")
    assert host_name("[::1]:8000") == "::1" and host_name("Example.COM.:80") == "example.com"


def test_allowed_hosts_and_origins_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMEAI_ALLOWED_HOSTS", "homeai.lan, proxy.example,")
    monkeypatch.setenv("HOMEAI_ORIGINS", "https://ha.example.org,chrome-extension://*")
    settings = Settings()
    assert settings.allowed_hosts == ("homeai.lan", "proxy.example")
    assert settings.origins == ("https://ha.example.org", "chrome-extension://*")
    web = WebOrigins.from_settings(settings)
    assert web.host_allowed("homeai.lan") and web.origin_allowed("chrome-extension://abcdef")


# ---- 2. Origin ------------------------------------------------------------------------------------
async def test_a_cross_site_page_cannot_drive_the_server(client: AsyncTestClient[Any], store: Store) -> None:
    """Before: a page anywhere on the web could POST text/plain or a form to 127.0.0.1:8000 without any
    preflight, and the server ran it (a chat in someone's name, a policy rollback, an index job)."""
    for path in ("/v1/chat/completions", "/api/chat", "/api/pull", "/v1/jobs", "/admin/policy/rollback"):
        r = await client.post(path, content=b'{"model": "x"}', headers=fetch_from(EVIL))
        assert r.status_code == 403, (path, r.text)
        assert EVIL in r.text and "HOMEAI_ORIGINS" in r.text
        r = await client.post(path, content=b"model=x", headers=form_post_from(EVIL))
        assert r.status_code == 403, (path, r.text)
    r = await client.post("/admin/policy/rollback", headers={"Origin": "null", "User-Agent": UA})  # sandboxed frame
    assert r.status_code == 403
    # a state-changing request a browser marks cross-site is refused even where it left Origin out
    r = await client.post("/v1/jobs/1/pause", headers={"Sec-Fetch-Site": "cross-site", "User-Agent": UA})
    assert r.status_code == 403
    r = await client.get("/v1/stats", headers={"Origin": EVIL, "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403  # reading: refused too, not only hidden by CORS
    assert await store.policy_versions.history(5) == []  # nothing ran


async def test_own_pages_and_clients_without_origin_are_served(client: AsyncTestClient[Any]) -> None:
    for origin in ("http://127.0.0.1:8000", "http://localhost:8000", "https://localhost:8000", "http://[::1]:8000"):
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin, "Sec-Fetch-Site":
                                                                             "same-origin"})
        assert r.status_code == 503, (origin, r.text)
        assert r.headers["access-control-allow-origin"] == origin
    for origin in ("http://localhost:3000", "http://127.0.0.1", "https://127.0.0.1:8443"):  # another local page
        assert (await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin})).status_code == 403
    # the openai / ollama packages, curl, Home Assistant: no Origin
    sdk = {"User-Agent": "OpenAI/Python 1.40.0", "Authorization": "Bearer unused"}
    assert (await client.post("/v1/chat/completions", json=CHAT, headers=sdk)).status_code == 503
    r = await client.get("/healthz", headers={"User-Agent": "curl/8.5.0"})
    assert r.status_code == 200


def test_same_origin_and_configured_origins() -> None:
    web = WebOrigins("0.0.0.0", 8000, origins=("https://*.example.org", "http://192.168.1.*:8123"),
                     hostname="homeserver", addresses=lambda: {"192.168.1.20"})
    assert web.origin_allowed("http://192.168.1.20:8000", "192.168.1.20:8000")  # the server's own page
    assert web.origin_allowed("http://homeserver:8000")
    assert web.origin_allowed("https://ha.example.org") and web.origin_allowed("http://192.168.1.5:8123")
    assert not web.origin_allowed("https://example.org.evil.example")
    assert not web.origin_allowed("http://evil.example:8000", "evil.example:8000")  # rebound: Host says no
    assert not web.origin_allowed("null") and not web.origin_allowed("file://") and not web.origin_allowed("x")
    assert WebOrigins(origins=("*",)).origin_allowed("https://anything.example")


def test_a_host_without_a_port_is_the_default_port_not_any_port() -> None:
    """Behind a proxy on port 80 the Host header has no port; it stood for "any port", so a page on another
    port of the same name passed for the server's own and could drive it."""
    web = WebOrigins("127.0.0.1", 8000)
    assert web.origin_allowed("http://localhost", "localhost")  # the page the proxy serves
    assert web.origin_allowed("https://localhost", "localhost")  # through a TLS proxy on 443
    for other in ("http://localhost:3000", "https://localhost:5173", "http://localhost:443"):
        assert not web.origin_allowed(other, "localhost"), other


async def test_cors_preflight(client: AsyncTestClient[Any]) -> None:
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type",
           "User-Agent": UA, "Sec-Fetch-Mode": "cors"}
    r = await client.options("/v1/chat/completions", headers={**ask, "Origin": "http://localhost:8000"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "http://localhost:8000"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = await client.options("/v1/chat/completions", headers={**ask, "Origin": EVIL})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers


async def test_configured_origin_is_served(store: Store, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, origins=("https://ha.example.org",), allowed_hosts=())
    async with AsyncTestClient(app=make_app(store, settings), base_url=BASE) as c:
        headers = fetch_from("https://ha.example.org", content_type="application/json")
        r = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 503 and r.headers["access-control-allow-origin"] == "https://ha.example.org"
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=fetch_from(EVIL))).status_code == 403


# ---- 3. JSON routes take application/json ---------------------------------------------------------
def body_routes(app: Litestar) -> list[tuple[str, str, bool]]:
    """(method, path, reads YAML) of every route that takes a body, with sample path parameters."""
    found = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            for method in sorted(set(getattr(handler, "http_methods", ())) & {"POST", "PUT", "PATCH"}):
                path = route.path.replace("{job_id:int}", "1").replace("{name:str}", "family")
                found.append((method, path, handler.opt.get("body") == "yaml"))
    return found


async def test_json_routes_refuse_other_media_types(client: AsyncTestClient[Any]) -> None:
    """Before: text/plain and form bodies were parsed as JSON, so a page's simple request reached the
    handlers. Every route that reads a body is found from the app, so a new one is covered too."""
    routes = body_routes(client.app)
    json_routes = [(m, p) for m, p, yaml in routes if not yaml]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/api/chat",
            "/api/generate", "/api/embed", "/api/embeddings", "/api/show", "/api/pull", "/v1/jobs", "/v1/search",
            "/admin/policy/rollback", "/v1/collections/family/readers"} <= {p for _, p in json_routes}
    for method, path in json_routes:
        for content_type in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", "application/json; charset=latin-1"):
            r = await client.request(method, path, content=b'{"model": "m"}', headers={"Content-Type": content_type})
            assert r.status_code == 415, (method, path, content_type, r.text)
            assert content_type.split(";")[0] in r.text and "application/json" in r.text
        r = await client.request(method, path, content=b'{"model": "m"}')  # a body without a type
        assert r.status_code == 415, (method, path)
        r = await client.request(method, path, content=b"{}",
                                 headers={"Content-Type": "application/json; charset=UTF-8"})
        assert r.status_code != 415, (method, path, r.text)


async def test_the_policy_put_takes_yaml(client: AsyncTestClient[Any]) -> None:
    text = DEFAULT_POLICY.read_bytes()
    for headers in ({"Content-Type": "application/yaml"}, {"Content-Type": "text/yaml; charset=utf-8"},
                    {"Content-Type": "text/plain"}, {}):
        r = await client.put("/admin/policy", content=text, headers=headers)
        assert r.status_code == 200, (headers, r.text)
    r = await client.put("/admin/policy", content=text, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and "application/yaml" in r.text


# ---- 5. strict types, keep_alive ------------------------------------------------------------------
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "max_tokens": "10"}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "stream": "true"}, "stream"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": "10"}, "max_tokens"),
    ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": "10"}, "max_output_tokens"),
    ("/v1/embeddings", {"model": "m", "input": "hi", "dimensions": "3"}, "dimensions"),
    ("/v1/search", {"collection": "c", "query": "q", "k": "3"}, "k"),
])
async def test_numbers_in_strings_are_refused(client: AsyncTestClient[Any], path: str, body: dict[str, Any],
                                              param: str) -> None:
    """Before: Litestar converted "10" to 10 and the request ran (OpenAI answers 400)."""
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_ollama_numbers_and_keep_alive(client: AsyncTestClient[Any]) -> None:
    r = await client.post("/api/chat", json={**CHAT, "options": {"num_predict": "5"}})
    assert r.status_code == 400 and "options.num_predict" in r.json()["error"]
    for path, body in (("/api/chat", CHAT), ("/api/generate", {"model": "m", "prompt": "hi"}),
                       ("/api/embed", {"model": "m", "input": "hi"}),
                       ("/api/embeddings", {"model": "m", "prompt": "x"})):
        r = await client.post(path, json={**body, "keep_alive": "banana"})
        assert r.status_code == 400, (path, r.text)
        assert "keep_alive" in r.json()["error"] and "banana" in r.json()["error"]
        for fine in ("5m", "1h30m", "0", -1, 300, 2.5, "-1m"):
            assert (await client.post(path, json={**body, "keep_alive": fine})).status_code == 503, (path, fine)


async def test_ollama_whole_number_options_may_come_as_floats(client: AsyncTestClient[Any]) -> None:
    """Home Assistant's form keeps numbers as floats and sends ``"num_ctx": 8192.0``; Ollama reads every
    number as a float64. Before: a 400 "Expected `int | null`, got `float`" on every chat."""
    options = {"num_ctx": 8192.0, "num_predict": 12.0, "top_k": 40.0, "seed": 7.0, "repeat_last_n": 64.0}
    for path, body in (("/api/chat", CHAT), ("/api/generate", {"model": "m", "prompt": "hi"}),
                       ("/api/embed", {"model": "m", "input": "hi"})):
        r = await client.post(path, json={**body, "options": options, "keep_alive": "-1.0s"})
        assert r.status_code == 503, (path, r.text)  # let through, to the engine (still starting here)
    r = await client.post("/api/chat", json={**CHAT, "options": {"num_ctx": "8192"}})  # a string stays a 400
    assert r.status_code == 400 and "options.num_ctx" in r.json()["error"]


async def test_top_p_0_is_taken(client: AsyncTestClient[Any]) -> None:
    """OpenAI and llama.cpp take top_p 0 (the most likely token only). Before: a 400 "Expected float > 0"."""
    assert (await client.post("/v1/chat/completions", json={**CHAT, "top_p": 0})).status_code == 503
    assert (await client.post("/api/chat", json={**CHAT, "options": {"top_p": 0}})).status_code == 503


# ---- 6. a large body is refused before it is read -------------------------------------------------
async def test_a_9_mb_body_is_413_before_it_is_parsed(client: AsyncTestClient[Any]) -> None:
    """Before: bodies up to 10 MiB were read and parsed (and a refused one's memory kept by the allocator).
    Not JSON at all: a 413, not a 400, shows that nothing parsed it."""
    body = b"{" + b"x" * (9 * 10**6)
    r = await client.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text[:200]
    r = await client.post("/api/chat", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "error" in r.json()
