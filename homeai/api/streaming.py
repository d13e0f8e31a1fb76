"""Streaming to clients that may leave at any moment, and noticing when they do.

A client that goes away must free the accelerator at once: its sequence is aborted and its KV blocks
come back. Two places need care:

- while a stream is being sent, Litestar cancels the sending task on ``http.disconnect`` but leaves our
  generator suspended at a ``yield`` (it would be closed only when garbage-collected). ``ClosingStream``
  closes it explicitly, which runs the ``finally`` / ``aclosing`` blocks that abort the request;
- before the first byte (a non-streaming answer, or the wait for the first token that decides the
  status code), nobody listens for the disconnect: ``until_disconnect`` races the work against it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Send

from homeai.api.errors import ClientGone

T = TypeVar("T")
SSE_MEDIA_TYPE = "text/event-stream"
NDJSON_MEDIA_TYPE = "application/x-ndjson"
_encoder = msgspec.json.Encoder()


class _ClosingASGIStreamingResponse(ASGIStreamingResponse):
    """Litestar's streaming response, plus: the iterator is closed however sending ends."""

    __slots__ = ()

    async def send_body(self, send: Send, receive: Receive) -> None:
        try:
            await super().send_body(send, receive)
        finally:
            aclose = getattr(self.iterator, "aclose", None)
            if aclose is not None:
                await aclose()


class ClosingStream(Stream):
    """A ``Stream`` whose async generator is closed on disconnect (so the request is aborted)."""

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        response = super().to_asgi_response(*args, **kwargs)
        # Same slots, one overridden method: swapping the class keeps every other Litestar behaviour.
        response.__class__ = _ClosingASGIStreamingResponse
        return response


def sse_stream(events: AsyncIterator[bytes]) -> ClosingStream:
    """Server-sent events (OpenAI streaming); proxies must not buffer them."""
    return ClosingStream(events, media_type=SSE_MEDIA_TYPE,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def ndjson_stream(lines: AsyncIterator[bytes]) -> ClosingStream:
    """Newline-delimited JSON (Ollama streaming)."""
    return ClosingStream(lines, media_type=NDJSON_MEDIA_TYPE, headers={"Cache-Control": "no-cache"})


def sse_data(payload: Any, event: str | None = None) -> bytes:
    """One SSE message: ``data: <json>`` (and ``event: <name>`` for the Responses API)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + _encoder.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def ndjson_line(payload: Any) -> bytes:
    return _encoder.encode(payload) + b"\n"


async def _wait_disconnect(request: Request[Any, Any, Any]) -> None:
    """Return when the client has gone; the body was already read, so only disconnects arrive."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await ``work``, but cancel it and raise ClientGone if the client disconnects first.

    Cancelling the work throws CancelledError into whatever engine iterator it awaits, whose
    ``finally`` aborts the request and frees its KV blocks.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        raise ClientGone("client disconnected")
    return task.result()
