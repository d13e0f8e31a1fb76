"""Web pages against the real server as shipped (loopback, no keys): a web page cannot drive it, and what it
refuses is a clean 4xx naming the field, never served, never metered, its body never read when too large.

Before: a rebound name or a cross-site text/plain POST ran a chat; ``X-HomeAI-Priority: -1`` was a 500
and 99 was queued; ``max_tokens: "10"``, ``keep_alive: "banana"``, a ``previous_response_id`` and
``{"not": {}}`` were all served; a too-long prompt's 400 named no field and
was metered with its 2,100 prompt tokens; a 9 MB body was read (and parsed) before its 400.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from waiting import DEFAULT_TIMEOUT_S, wait_until

pytestmark = pytest.mark.slow
LLM = "smollm2-135m-instruct"
PROBE = "refused-probe"  # the user every refused request below names (X-HomeAI-User): none may be metered
ASK = [{"role": "user", "content": "Say hi."}]
CHROME = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 "
          "Safari/537.36")


def openai_error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json()["error"]  # type: ignore[no-any-return]


def metered(http: httpx.Client) -> tuple[dict[str, dict[str, int]], dict[str, Any]]:
    """(requests by status per class, the probe user's entry or {}) from /v1/stats."""
    body = http.get("/v1/stats").json()
    return ({name: dict(c.get("requests", {})) for name, c in body["classes"].items()},
            body.get("users", {}).get(PROBE, {}))


def test_a_web_page_cannot_drive_the_server(http: httpx.Client, server_url: str) -> None:
    port = urlsplit(server_url).port
    before = metered(http)
    rebound = {"Host": f"rebind.evil.example:{port}", "Origin": f"http://rebind.evil.example:{port}",
               "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "User-Agent": CHROME, "X-HomeAI-User": PROBE}
    r = http.post("/v1/chat/completions", json={"model": LLM, "messages": ASK}, headers=rebound)
    assert openai_error(r, 403)["code"] == "host_not_allowed"
    cross_site = {"Origin": "https://evil.example", "Content-Type": "text/plain;charset=UTF-8", "User-Agent": CHROME,
                  "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty",
                  "X-HomeAI-User": PROBE}
    for path in ("/v1/chat/completions", "/api/chat", "/api/generate"):
        r = http.post(path, content=b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], '
                                    b'"prompt": "hi", "stream": false}' % LLM.encode(), headers=cross_site)
        assert r.status_code == 403, (path, r.text)
    r = http.post("/admin/policy/rollback", headers={**cross_site, "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 403
    # the same request from no browser (an SDK, curl) is served; from a non-browser with text/plain: 415
    r = http.post("/v1/chat/completions", content=b"{}", headers={"Content-Type": "text/plain"})
    assert openai_error(r, 415)["code"] == "unsupported_media_type" and "text/plain" in r.text
    r = http.options("/v1/chat/completions", headers={"Origin": server_url, "Access-Control-Request-Method": "POST",
                                                     "Access-Control-Request-Headers": "content-type"})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == server_url
    assert metered(http) == before


def test_a_large_body_is_refused_before_it_is_sent(server_url: str, http: httpx.Client) -> None:
    """Only the headers of a 9 MB body are sent, and the 413 comes back: nothing waited for the body, let
    alone read or parsed it (a server that did would still be waiting, and the recv would time out)."""
    parts = urlsplit(server_url)
    rss_before = http.get("/v1/stats").json()["memory"]["rss_mb"]
    for _ in range(3):
        with socket.create_connection((parts.hostname, parts.port), timeout=DEFAULT_TIMEOUT_S) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 9000000\r\n\r\n")
            head = s.recv(4096)
            assert head.startswith(b"HTTP/1.1 413"), head[:200]
    big = b'{"model": "' + b"x" * 9_000_000 + b'"}'
    for _ in range(5):  # sent whole: refused by its length
        r = http.post("/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
        openai_error(r, 413)
    assert http.get("/v1/stats").json()["memory"]["rss_mb"] - rss_before < 20


def test_refusals_are_clean_4xx_naming_the_field_and_not_metered(http: httpx.Client) -> None:
    wait_idle(http)
    before = metered(http)
    probe = {"X-HomeAI-User": PROBE}
    chat = {"model": LLM, "messages": ASK, "max_tokens": 2}
    for level in ("-1", "0", "2", "99"):  # the chat class has one level
        error = openai_error(http.post("/v1/chat/completions", json=chat,
                                       headers={**probe, "X-HomeAI-Class": "chat", "X-HomeAI-Priority": level}))
        assert error["param"] == "x-homeai-priority" and "X-HomeAI-Priority" in error["message"], error
    r = http.post("/api/embed", json={"model": "all-minilm-l6-v2", "input": "x"}, headers={**probe,
                                                                                          "X-HomeAI-Priority": "-1"})
    assert r.status_code == 400 and "X-HomeAI-Priority" in r.json()["error"]
    assert openai_error(http.post("/v1/chat/completions", json={**chat, "max_tokens": "10"},
                                  headers=probe))["param"] == "max_tokens"
    for path, body in (("/api/chat", {"model": LLM, "messages": ASK}),
                       ("/api/generate", {"model": LLM, "prompt": "hi"})):
        r = http.post(path, json={**body, "keep_alive": "banana", "stream": False}, headers=probe)
        assert r.status_code == 400 and "keep_alive" in r.json()["error"], r.text
    long = "hello " * 2100
    error = openai_error(http.post("/v1/chat/completions", json={"model": LLM, "messages": [
        {"role": "user", "content": long}]}, headers=probe))
    assert error["param"] == "messages" and error["code"] == "context_length_exceeded" and "2048" in error["message"]
    error = openai_error(http.post("/v1/completions", json={"model": LLM, "prompt": long}, headers=probe))
    assert error["param"] == "prompt"
    error = openai_error(http.post("/v1/responses", json={"model": LLM, "input": long}, headers=probe))
    assert error["param"] == "input"
    r = http.post("/api/generate", json={"model": LLM, "prompt": long, "stream": False}, headers=probe)
    assert r.status_code == 400 and "prompt" in r.json()["error"] and "2048" in r.json()["error"]
    error = openai_error(http.post("/v1/responses", json={"model": LLM, "input": "hi",
                                                          "previous_response_id": "resp_nowhere"}, headers=probe))
    assert error["param"] == "previous_response_id" and error["code"] == "previous_response_not_found"
    error = openai_error(http.post("/v1/chat/completions", json={**chat, "response_format": {
        "type": "json_schema", "json_schema": {"name": "nothing", "schema": {"not": {}}}}}, headers=probe))
    assert error["param"].startswith("response_format") and "'not'" in error["message"]
    wait_idle(http)
    assert metered(http) == before  # not one of them reached the engine's meter


def test_what_is_valid_is_still_served(http: httpx.Client) -> None:
    chat = {"model": LLM, "messages": ASK, "max_tokens": 2}
    r = http.post("/v1/chat/completions", json=chat, headers={"X-HomeAI-Class": "chat", "X-HomeAI-Priority": "1"})
    assert r.status_code == 200, r.text
    for keep_alive in ("5m", "1h30m", "0", -1, 300):
        r = http.post("/api/chat", json={"model": LLM, "messages": ASK, "stream": False, "keep_alive": keep_alive,
                                         "options": {"num_ctx": 2048, "num_predict": 2}})
        assert r.status_code == 200, (keep_alive, r.text)
    r = http.post("/v1/chat/completions", content=b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}],'
                  b' "max_tokens": 2}' % LLM.encode(), headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text


def wait_idle(http: httpx.Client) -> None:
    """Until no request is live: a metered request ends (and is counted) after its answer went out."""
    wait_until(lambda: not http.get("/v1/stats").json().get("num_live_requests", 0), interval_s=0.1,
               what="no live request")
