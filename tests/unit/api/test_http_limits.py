"""The HTTP server bounds a request's head (found by a security review: under httptools, header lines sent
without end grew the process with no bound, before any key or origin check). A real uvicorn server on a
loopback port, with the protocol ``homeai serve`` uses."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from homeai.api.http_limits import MAX_HEAD_BYTES, server_limits


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hi"})


@pytest.fixture
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(hello, log_level="warning", lifespan="off", **server_limits()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


def _answer(conn: socket.socket) -> bytes:
    """All the server sends until it closes (a reset after the answer counts as closed; a server that
    neither answers nor closes times out: socket.timeout)."""
    conn.settimeout(5)
    out = b""
    try:
        while chunk := conn.recv(65536):
            out += chunk
    except ConnectionResetError:  # closed with our unread lines in its buffer
        return out or b"(reset)"
    return out


def test_headers_without_end_get_431_and_the_connection_closes(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        sent = 0
        try:
            while sent <= 2 * MAX_HEAD_BYTES:  # before: taken for good, whatever was sent
                line = b"X-A: " + b"a" * 4000 + b"\r\n"
                conn.sendall(line)
                sent += len(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us, as it should be
        answer = _answer(conn)
    assert answer.startswith(b"HTTP/1.1 431") or answer == b"(reset)", answer[:80]


def test_a_request_with_a_large_body_and_a_kept_alive_next_one_are_served(port: int) -> None:
    """Only the head counts: a body read with it, and the next request on the same connection, are fine."""
    body = b"x" * (3 * MAX_HEAD_BYTES)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
                     + b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _answer(conn)
    assert answer.count(b"HTTP/1.1 200") == 2, answer[:200]
