"""An admitted LLM request's life in the engine: ``Generation`` submits it (its first delta decides the
HTTP status) and reads its deltas (metered by the gateway itself, like every other submission: see
gateway/metering.py); ``AnswerReader`` turns the deltas into the steps every API's encoder reads: the
text already split into text and tool-call events when the answer may call tools, and an engine error
(a failed step, a drain at shutdown) as a step of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from litestar import Request

from homeai.api.drain import engine_error
from homeai.api.errors import to_api_error
from homeai.api.routing import RequestContext
from homeai.api.streaming import until_disconnect
from homeai.api.tool_calls import ParseEvent, ToolCall, ToolCallParser
from homeai.core.types import FinishReason, SamplingParams, TokenDelta, TokenLogprob
from homeai.engine.errors import QueueTimeoutError
from homeai.gateway.gateway import Gateway, Route
from homeai.gateway.metering import outcome_of_delta


class Generation:
    """One LLM request in the engine: submitted by ``open`` (whose first delta decides the HTTP status),
    then read by ``deltas`` or ``collect``. Leaving early aborts it (the gateway meters the outcome)."""

    def __init__(self, request: Request[Any, Any, Any], gateway: Gateway, route: Route, prompt_ids: list[int],
                 params: SamplingParams, ctx: RequestContext, kind: str, fits: bool = True) -> None:
        self.request = request
        self.fits = fits  # False: a constrained answer too long for the budget, never started (see open)
        self.gateway = gateway
        self.route, self.prompt_ids, self.params, self.ctx, self.kind = route, prompt_ids, params, ctx, kind
        self.request_id = uuid.uuid4().hex
        self.num_output_tokens = 0
        self.output_ids: list[int] = []  # the answer's token ids (Ollama's /api/generate ``context``)
        self.num_cached_tokens = 0  # prompt tokens the prefix cache held (OpenAI usage's cached_tokens)
        self.logprobs: list[TokenLogprob] = []  # every token's, when the params ask for them
        self._first: TokenDelta | None = None
        self._iterator: AsyncGenerator[TokenDelta, None] | None = None

    async def open(self) -> TokenDelta:
        """Queue the request and wait for its first delta; raises ApiError (400/429/503/499...).

        A constrained answer whose shortest valid form does not fit in its budget (a forced call, a
        JSON schema) is not started: it ends at once, empty, with finish reason "length", rather than
        in call syntax or JSON that the budget cuts (``admission.constrain``)."""
        route, ctx = self.route, self.ctx
        if not self.fits:
            self._iterator = _no_deltas()
            self._first = TokenDelta(self.request_id, "", [], len(self.prompt_ids), 0, FinishReason.LENGTH)
            return self._first
        self._iterator = self.gateway.generate(route, self.prompt_ids, self.params, ctx.user, self.request_id,
                                               ctx.priority_level, ctx.timeout_us, kind=self.kind)
        try:
            first = await until_disconnect(self.request, anext(self._iterator))
        except BaseException as exc:
            await self._iterator.aclose()
            raise to_api_error(exc) if isinstance(exc, Exception) else exc from None
        if first.error is not None:
            await self._iterator.aclose()
            if outcome_of_delta(first) == "timeout":  # the same error as an embedding's queue timeout
                raise to_api_error(QueueTimeoutError(f"{first.error} in class {route.class_name!r}"))
            raise engine_error(self.request, first.error)  # 503 when a drain ended it
        self._count(first)
        self._first = first
        return first

    async def deltas(self) -> AsyncGenerator[TokenDelta, None]:
        """The first delta, then the rest; closing this generator early aborts the request."""
        assert self._first is not None and self._iterator is not None, "open() first"
        async with aclosing(self._iterator) as rest:
            delta = self._first
            yield delta
            while not delta.finished:
                delta = await anext(rest)
                self._count(delta)
                yield delta

    async def collect(self) -> tuple[str, FinishReason | None]:
        """Non-streaming: the whole text and finish reason; a disconnect meanwhile aborts the request."""
        async def read() -> tuple[str, FinishReason | None, str | None]:
            parts: list[str] = []
            last: TokenDelta | None = None
            async with aclosing(self.deltas()) as stream:
                async for last in stream:
                    parts.append(last.text)
            return "".join(parts), last.finish_reason if last else None, last.error if last else None

        text, finish_reason, error = await until_disconnect(self.request, read())
        if error is not None:
            raise engine_error(self.request, error)
        return text, finish_reason

    def _count(self, delta: TokenDelta) -> None:
        self.num_output_tokens += len(delta.token_ids)
        self.output_ids += delta.token_ids
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        self.logprobs += delta.logprobs


async def _no_deltas() -> AsyncGenerator[TokenDelta, None]:
    return
    yield  # an async generator that ends at once


@dataclass(slots=True)
class AnswerStep:
    """One delta of the answer: its raw ``text``, the ``events`` made of it (text, and calls once each is
    complete: a call the budget cuts short never appears), the tokens' logprobs, and how it ended
    (``finished``: the last step; ``error``: the engine ended it, no further step follows)."""

    text: str = ""
    events: list[ParseEvent] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None


class AnswerReader:
    """Reads a generation step by step; ``calls``: the complete tool calls read so far."""

    def __init__(self, generation: Generation, reads_calls: bool) -> None:
        self.generation = generation
        self.parser = ToolCallParser() if reads_calls else None

    @property
    def calls(self) -> list[ToolCall]:
        return self.parser.calls if self.parser is not None else []

    async def steps(self) -> AsyncGenerator[AnswerStep, None]:
        """The answer's steps; closing this generator early aborts the request."""
        async with aclosing(self.generation.deltas()) as deltas:
            async for delta in deltas:
                if delta.error:
                    yield AnswerStep(error=delta.error, finished=True)
                    return
                yield AnswerStep(delta.text, self._events(delta.text, delta.finished), delta.logprobs,
                                 delta.finished, delta.finish_reason)

    def _events(self, text: str, finished: bool) -> list[ParseEvent]:
        if self.parser is None:
            return [ParseEvent(text=text)] if text else []
        return self.parser.feed(text) + (self.parser.finish() if finished else [])
