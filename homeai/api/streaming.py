"""Streaming to clients that may leave at any moment, and noticing when they do.

A client that goes away must free the accelerator at once: its sequence is aborted and its KV blocks
come back. Two places need care:

- while a stream is being sent, Litestar cancels the sending task on ``http.disconnect`` but leaves our
  generator suspended at a ``yield`` (it would be closed only when garbage-collected). ``ClosingStream``
  answers with ``ClosingASGIStreamingResponse``, which closes it explicitly however sending ends; that
  runs the ``finally`` / ``aclosing`` blocks that abort the request;
- before the first byte (a non-streaming answer, or the wait for the first token that decides the
  status code), nobody listens for the disconnect: ``until_disconnect`` races the work against it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Iterable
from typing import Any, TypeVar

import msgspec
from litestar import Litestar, Request
from litestar.background_tasks import BackgroundTask, BackgroundTasks
from litestar.datastructures import Cookie
from litestar.enums import MediaType
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Receive, Send, TypeEncodersMap
from litestar.utils.helpers import get_enum_string_value

from homeai.api.errors import ClientGone

T = TypeVar("T")
SSE_MEDIA_TYPE = "text/event-stream"
NDJSON_MEDIA_TYPE = "application/x-ndjson"
_encoder = msgspec.json.Encoder()


class ClosingASGIStreamingResponse(ASGIStreamingResponse):
    """Litestar's streaming response, plus: the generator is closed however sending ends."""

    __slots__ = ()

    async def send_body(self, send: Send, receive: Receive) -> None:
        try:
            await super().send_body(send, receive)
        finally:
            if isinstance(self.iterator, AsyncGenerator):
                await self.iterator.aclose()


class ClosingStream(Stream):
    """A ``Stream`` of an async generator that is closed on disconnect (so the request is aborted).

    Built as Litestar's ``Stream.to_asgi_response`` builds its response, with two differences: the
    response class, and the stream's own media type wins over the route's default (as for Litestar's
    other responses), so an SSE answer says ``text/event-stream`` rather than ``application/json``.
    """

    __slots__ = ("events",)

    def __init__(self, events: AsyncGenerator[bytes, None], *, media_type: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(events, media_type=media_type, headers=headers)
        self.events = events

    def to_asgi_response(self, app: Litestar | None, request: Request[Any, Any, Any], *,
                         background: BackgroundTask | BackgroundTasks | None = None,
                         cookies: Iterable[Cookie] | None = None,
                         encoded_headers: Iterable[tuple[bytes, bytes]] | None = None,
                         headers: dict[str, str] | None = None, is_head_response: bool = False,
                         media_type: MediaType | str | None = None, status_code: int | None = None,
                         type_encoders: TypeEncodersMap | None = None) -> ASGIResponse:
        return ClosingASGIStreamingResponse(
            iterator=self.events,
            background=self.background or background,
            content_length=0,
            cookies=self.cookies if cookies is None else [*self.cookies, *cookies],
            encoded_headers=encoded_headers,
            encoding=self.encoding,
            headers={**headers, **self.headers} if headers is not None else self.headers,
            is_head_response=is_head_response,
            media_type=get_enum_string_value(self.media_type or media_type or MediaType.JSON),
            status_code=self.status_code or status_code,
        )


def sse_stream(events: AsyncGenerator[bytes, None]) -> ClosingStream:
    """Server-sent events (OpenAI streaming); proxies must not buffer them."""
    return ClosingStream(events, media_type=SSE_MEDIA_TYPE,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def ndjson_stream(lines: AsyncGenerator[bytes, None]) -> ClosingStream:
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
