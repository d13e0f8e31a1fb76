"""Metering at the gateway: every submission is recorded once, whoever submitted it.

HTTP handlers, indexing jobs, prompt jobs and search all reach the device through ``Gateway.generate``
and ``Gateway.embed``; both hand their work to a ``Meter`` here, so the recorder (and through its
listeners the request log) sees job traffic exactly as it sees HTTP traffic, and no caller can forget
or double a record. A submission starts when its work is handed to the engine (the first ``anext`` of
a stream, the call of an embedding) and ends once, with one outcome:

    ok        the stream reached its final delta / the vectors came back
    aborted   the caller left early (closed the stream, was cancelled) or the engine aborted it
    rejected  the class queue was full (HTTP 429)
    timeout   the request waited in its queue past its timeout (HTTP 503)
    error     anything else (a refused request, an engine failure)

A metering failure is logged and never fails the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from homeai.core.types import FinishReason, TokenDelta
from homeai.engine.errors import ClassRetiredError, QueueTimeoutError
from homeai.scheduling.class_queue import QueueFullError

log = logging.getLogger(__name__)

T = TypeVar("T")


class RequestSink(Protocol):
    """What a meter reports to (``homeai.metrics.recorder.MetricsRecorder`` is one)."""

    def request_started(self, request_id: str, kind: str, class_name: str, user: str, model: str,
                        num_prompt_tokens: int) -> None: ...

    def queued(self, request_id: str, seconds: float) -> None: ...

    def tokens(self, request_id: str, n: int) -> None: ...

    def finished(self, request_id: str, status: str, num_output_tokens: int) -> None: ...

    def rejected(self, class_name: str, reason: str) -> None: ...

    def placed(self, request_id: str, node: str) -> None: ...


@dataclass(slots=True)
class Submission:
    """Who submitted what: the fields every record carries."""

    request_id: str
    kind: str  # chat, completion, response, embedding
    class_name: str
    user: str
    model: str
    num_prompt_tokens: int


def outcome_of(exc: BaseException) -> str:
    """The status of a submission that ended with ``exc``."""
    if isinstance(exc, (QueueFullError, ClassRetiredError)):
        return "rejected"
    if isinstance(exc, QueueTimeoutError):
        return "timeout"
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "aborted"
    return "error"


def outcome_of_delta(delta: TokenDelta) -> str:
    """The status of a stream whose last delta is ``delta`` (a queue timeout arrives as an error delta)."""
    if delta.timed_out:  # a status, not the word "timeout" in an error text
        return "timeout"
    if delta.error is not None:
        return "error"
    return "aborted" if delta.finish_reason == FinishReason.ABORT else "ok"


class Meter:
    """Wraps the gateway's streams and embedding calls; ``sink`` None meters nothing (engine benches)."""

    def __init__(self, sink: RequestSink | None = None) -> None:
        self.sink = sink

    async def stream(self, sub: Submission, deltas: AsyncIterator[TokenDelta]) -> AsyncGenerator[TokenDelta, None]:
        """``deltas`` as they come, recorded; the record ends at the final (or first error) delta, so a
        caller that stops reading there leaves nothing open. Closing early aborts the engine stream."""
        self._call("request_started", sub.request_id, sub.kind, sub.class_name, sub.user, sub.model,
                   sub.num_prompt_tokens)
        num_output_tokens, status = 0, None
        try:
            async for delta in deltas:
                if delta.queue_s is not None:  # admitted: its wait in the class queue
                    self._call("queued", sub.request_id, delta.queue_s)
                if delta.token_ids:  # the first ones also stamp TTFT: a stream ended before any token has none
                    num_output_tokens += len(delta.token_ids)
                    self._call("tokens", sub.request_id, len(delta.token_ids))
                if delta.finished or delta.error is not None:
                    status = outcome_of_delta(delta)
                    self._end(sub, status, num_output_tokens)
                yield delta
                if status is not None:
                    return
        except BaseException as exc:
            if status is None:
                status = outcome_of(exc)
                self._end(sub, status, num_output_tokens)
            raise
        finally:
            if isinstance(deltas, AsyncGenerator):  # the engine's stream: closing it aborts the sequence
                await deltas.aclose()
            if status is None:  # the engine stream ended without a final delta
                self._end(sub, "aborted", num_output_tokens)

    async def call(self, sub: Submission, work: Awaitable[T]) -> T:
        """Await ``work`` (an embedding), recorded as one submission without output tokens."""
        self._call("request_started", sub.request_id, sub.kind, sub.class_name, sub.user, sub.model,
                   sub.num_prompt_tokens)
        try:
            result = await work
        except BaseException as exc:
            self._end(sub, outcome_of(exc), 0)
            raise
        self._end(sub, "ok", 0)
        return result

    def placed(self, request_id: str, node: str) -> None:
        """The request is served by ``node`` (a cluster's node name; called at each placement, the last
        one counts), so the request log says which node served what."""
        self._call("placed", request_id, node)

    def refused(self, class_name: str, status: str) -> None:
        """A request refused before it was submitted (``status``: rejected or timeout), as while its model
        loads: counted with the queues' own refusals (homeai_rejections_total, /v1/stats)."""
        self._call("rejected", class_name, "queue_full" if status == "rejected" else "timeout")

    def _end(self, sub: Submission, status: str, num_output_tokens: int) -> None:
        self._call("finished", sub.request_id, status, num_output_tokens)
        if status in ("rejected", "timeout"):
            self.refused(sub.class_name, status)

    def _call(self, name: str, *args: object) -> None:
        if self.sink is None:
            return
        try:
            getattr(self.sink, name)(*args)
        except Exception:
            log.exception("metering: %s failed", name)

