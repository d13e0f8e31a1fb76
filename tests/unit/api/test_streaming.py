"""Disconnects without a server: a closed stream closes its generator; a racing wait is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
from waiting import DEFAULT_TIMEOUT_S

from homeai.api.errors import ClientGone
from homeai.api.streaming import (
    NDJSON_MEDIA_TYPE,
    SSE_MEDIA_TYPE,
    ClosingASGIStreamingResponse,
    ndjson_stream,
    sse_data,
    sse_stream,
    until_disconnect,
)


async def _disconnect_once(happened: asyncio.Event) -> dict[str, Any]:
    """The client's ``http.disconnect``, delivered once ``happened`` is set (never, if it is not)."""
    await happened.wait()
    return {"type": "http.disconnect"}


async def test_stream_closes_its_generator_when_the_client_leaves() -> None:
    """Litestar cancels the sending task on disconnect; our generator must see GeneratorExit (its
    ``finally`` is where the engine request is aborted), not wait for the garbage collector."""
    closed, sending = asyncio.Event(), asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: x\n\n"
        finally:
            closed.set()

    sent: list[Any] = []

    async def stuck_send(message: Any) -> None:  # a slow client: the disconnect comes while sending
        sent.append(message)
        sending.set()
        await asyncio.Event().wait()  # never done: only the disconnect ends this send

    stream = endless()  # held here, as Litestar's response holds it: no garbage collection to help
    response = ClosingASGIStreamingResponse(iterator=stream)
    await asyncio.wait_for(response.send_body(stuck_send, lambda: _disconnect_once(sending)), DEFAULT_TIMEOUT_S)
    assert closed.is_set() and len(sent) == 1


async def test_streams_go_out_as_closing_responses_with_their_own_media_type() -> None:
    """The route's default media type (JSON) does not override the stream's: an SSE answer says
    text/event-stream (browsers' EventSource refuses anything else), NDJSON application/x-ndjson."""

    async def one() -> AsyncGenerator[bytes, None]:
        yield b"x"

    for stream, media_type in ((sse_stream(one()), SSE_MEDIA_TYPE), (ndjson_stream(one()), NDJSON_MEDIA_TYPE)):
        response = stream.to_asgi_response(None, None, media_type="application/json")  # type: ignore[arg-type]
        assert isinstance(response, ClosingASGIStreamingResponse)
        headers = dict(response.encode_headers())
        assert headers[b"content-type"].decode().startswith(media_type), headers


class _FakeRequest:
    """A request whose client leaves once ``gone`` is set."""

    def __init__(self, gone: asyncio.Event) -> None:
        self.gone = gone

    async def receive(self) -> dict[str, Any]:
        return await _disconnect_once(self.gone)


async def test_until_disconnect_cancels_the_work() -> None:
    working, cancelled = asyncio.Event(), asyncio.Event()

    async def endless_work() -> int:
        working.set()  # the client leaves while the work runs
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    with pytest.raises(ClientGone):
        await asyncio.wait_for(until_disconnect(_FakeRequest(working), endless_work()),  # type: ignore[arg-type]
                               DEFAULT_TIMEOUT_S)
    assert cancelled.is_set()
    stays = _FakeRequest(asyncio.Event())  # a client that never leaves
    assert await until_disconnect(stays, asyncio.sleep(0, result=7)) == 7  # type: ignore[arg-type]


def test_sse_format() -> None:
    assert sse_data({"a": 1}) == b'data: {"a":1}\n\n'
    assert sse_data({"a": 1}, event="e") == b'event: e\ndata: {"a":1}\n\n'
