"""The HTTP server's own limits, before any route, key or origin check runs.

uvicorn's httptools protocol (the fast one ``homeai serve`` uses) kept every header line of a request it
was still reading, with no bound and no timeout: a client on the LAN sending ``X-A: aaaa...`` lines
without end grew the process until it was killed, household requests with it (h11 stops at 16 KB).
``HeadLimitedHttpTools`` answers 431 and closes once a request's head passes ``MAX_HEAD_BYTES``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 256 * 1024  # a request line and headers; browsers and SDKs send a few KB
MAX_CONNECTIONS = 1024  # open connections before uvicorn answers 503 (a household's streams are tens)
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
              b"connection: close\r\ncontent-length: 38\r\n\r\nrequest line and headers are too large")


class HeadLimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, counting what a request's head has sent so far (bytes of the reads that
    end while it is still unfinished: a read that finishes it, its body included, is not counted)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes, self._in_head = 0, True

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes, self._in_head = 0, True  # a kept-alive connection's next request

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self.logger.warning("a request's head passed %d bytes: 431, connection closed", MAX_HEAD_BYTES)
                self.transport.write(_TOO_LARGE)
                self.transport.close()


def server_limits() -> dict[str, Any]:
    """uvicorn.Config arguments for the limits above."""
    return {"http": HeadLimitedHttpTools, "limit_concurrency": MAX_CONNECTIONS}
