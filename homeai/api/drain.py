"""Graceful drain on SIGTERM: stop admitting, let running requests finish, then end what is left cleanly.

uvicorn, on SIGTERM, closes its listening sockets and waits for open connections before it runs the
lifespan shutdown, and after ``timeout_graceful_shutdown`` it cancels whatever still runs: streams
were cut mid-body with tracebacks. So ``homeai serve`` tells the app's ``Drain`` the moment the signal
arrives (``begin``), and gives uvicorn a longer timeout than the drain's own:

1. from ``begin``: requests that still reach the app get 503 with Retry-After; /readyz says "draining";
   the live-stats stream (endless by design) ends;
2. for ``timeout_s`` (Settings.drain_timeout_s, 30 s by default): running requests go on;
3. at the deadline, every LLM sequence still in the engine is ended with an error, which each stream
   turns into its API's ending (OpenAI: an error event, then ``[DONE]``; Responses: ``response.failed``;
   Ollama: an error line); then uvicorn's own wait ends, and the lifespans flush the request log and
   stop the engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from homeai.api.errors import ApiError, ServiceUnavailable

log = logging.getLogger(__name__)

SHUTDOWN_MESSAGE = "the server is shutting down; the answer was cut short"
DRAIN_GRACE_S = 5.0  # uvicorn waits this much longer than the drain, for the final messages to go out
RESTART_ESTIMATE_S = 10.0  # added to Retry-After: a supervised server is back after its restart


class Drain:
    """Whether the server is draining, since when, and what to do when the drain time is up."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self.began_s: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._on_deadline: Callable[[], None] | None = None

    @property
    def draining(self) -> bool:
        return self.began_s is not None

    def attach(self, loop: asyncio.AbstractEventLoop, on_deadline: Callable[[], None]) -> None:
        """Called at start-up on the server's loop: where ``begin`` schedules, and what the deadline does."""
        self._loop, self._on_deadline = loop, on_deadline

    def begin(self) -> None:
        """Start draining (safe from a signal handler; a second call changes nothing)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin)
        else:
            self._begin()

    def _begin(self) -> None:
        if self.began_s is not None:
            return
        self.began_s = self._clock()
        log.warning("draining: new requests get 503; running ones have %.0f s to finish", self.timeout_s)
        if self._loop is not None:
            self._timer = self._loop.call_later(self.timeout_s, self._deadline)

    def _deadline(self) -> None:
        self._timer = None
        log.warning("drain time is up: ending the requests still running")
        if self._on_deadline is not None:
            self._on_deadline()

    def close(self) -> None:
        """At shutdown: nothing is left to end."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def retry_after_s(self) -> int:
        left = self.timeout_s if self.began_s is None else self.timeout_s - (self._clock() - self.began_s)
        return max(1, math.ceil(max(0.0, left) + RESTART_ESTIMATE_S))


def end_open_generations(gateway: Any) -> None:
    """End every LLM sequence with the shutdown error (each engine does it on its device thread), and start
    none after this (a request still waiting for an on-demand model's load would have run until uvicorn
    cut it, with no final message)."""
    if gateway is None:
        return
    gateway.closing = SHUTDOWN_MESSAGE
    for engine in gateway.llms.values():
        engine.fail_all_soon(SHUTDOWN_MESSAGE)
    end_remote = getattr(gateway, "end_remote_streams", None)  # a cluster's front door: its nodes' streams
    if callable(end_remote):
        end_remote()


def engine_error(connection: ASGIConnection[Any, Any, Any, Any], message: str) -> ApiError:
    """The HTTP error of a request the engine ended with ``message`` before its answer was sent: 503 with
    Retry-After while draining (the drain ended it, and a retry after the restart succeeds), else 500."""
    from homeai.api.services import services_of  # services.py imports Drain from here

    drain = services_of(connection).drain
    if drain.draining:
        return ServiceUnavailable(message, code="shutting_down", headers={"Retry-After": str(drain.retry_after_s())})
    return ApiError(message, status_code=500, code="engine_error")


async def refuse_while_draining(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """App guard: while draining, every route but the public probes answers 503 with Retry-After."""
    from homeai.api.services import services_of  # services.py imports Drain from here

    drain = services_of(connection).drain
    if not drain.draining or handler.opt.get("auth") == "public":
        return
    raise ServiceUnavailable("the server is shutting down; retry shortly", code="shutting_down",
                             headers={"Retry-After": str(drain.retry_after_s())})
