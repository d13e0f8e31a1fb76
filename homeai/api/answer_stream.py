"""An admitted request's answer as every API's encoder reads it: one step per engine delta, with the text
already split into text and tool-call events when the answer may call tools, and an engine error (a
failed step, a drain at shutdown) as a step of its own. The encoders (OpenAI chat and text completions,
Responses, Ollama) only turn steps into their wire format.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from homeai.api.serving import Generation
from homeai.api.tool_calls import ParseEvent, ToolCall, ToolCallParser
from homeai.core.types import FinishReason, TokenLogprob


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
