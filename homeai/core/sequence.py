"""A request as the engine tracks it: its tokens, how many have KV in the cache, and how it ends."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

from homeai.core.types import FinishReason, SamplingParams


class SequenceStatus(enum.IntEnum):
    """Ordered so that everything after PREEMPTED is finished (as in vLLM's RequestStatus)."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_TIMED_OUT = 6  # waited in its queue past its timeout (REJECT): HTTP 503, never an error string

    @property
    def is_finished(self) -> bool:
        return self > SequenceStatus.PREEMPTED

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: FinishReason.STOP,
    SequenceStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    SequenceStatus.FINISHED_ABORTED: FinishReason.ABORT,
    SequenceStatus.FINISHED_TIMED_OUT: FinishReason.ABORT,
}


class TextSink(Protocol):
    """The detokenizer as the sequence sees it: feeds tokens, says when a stop string appeared."""

    stopped: bool

    def push(self, token_id: int) -> str: ...
    def flush(self) -> str: ...


@dataclass(slots=True, eq=False)
class Sequence:
    """There is no prefill or decode phase: the sequence has tokens and ``num_computed_tokens`` of them
    have KV in the cache. A preempted sequence drops its KV and recomputes prompt + output later."""

    seq_id: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    arrival_s: float = 0.0
    class_name: str = "default"
    user: str = "default"
    priority: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    sink: TextSink | None = None
    pending_text: str = ""  # produced by the sink since the engine last emitted
    # logprobs of tokens whose text the sink still holds (it may begin a stop string, or end in half a
    # character): they go out with that text, and are dropped with it when a stop string cuts it
    held_logprobs: list[Any] = field(default_factory=list)
    first_token_s: float | None = None
    # What the request asked of its queue (None: the class's defaults).
    priority_level: int | None = None
    timeout_us: int | None = None
    # Bookkeeping of the scheduler and the engine, typed rather than a grab-bag dict.
    queue_item: object | None = None  # the scheduler's handle in its class queue
    num_charged_prompt_tokens: int = 0  # prompt tokens fairness has charged (not again after preemption)
    admitted_s: float | None = None  # when it first left its class queue (the scheduler's clock)
    queue_reported: bool = False  # its wait in the queue went out with a delta
    num_emitted_tokens: int = 0  # output tokens already handed to the stream
    num_cached_prompt_tokens: int = 0  # prompt tokens its first admission found in the prefix cache
    error: str | None = None  # why it failed, for the client (a timeout is a status, not this text)
    refusal: Exception | None = None  # rejected from its queue with this (pushed out of a full one: 429)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens known but not yet in the cache: the prompt (or its rest), or the last sampled token."""
        return self.num_tokens - self.num_computed_tokens

    def token_ids(self, start: int, end: int) -> list[int]:
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    def append_token(self, token_id: int) -> SequenceStatus | None:
        """Record a sampled token; return the finished status if this token ends the sequence."""
        params = self.params
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids):
            self.output_token_ids.append(token_id)
            return SequenceStatus.FINISHED_STOPPED  # the stop token's text is never shown
        self.output_token_ids.append(token_id)
        if self.sink is not None:
            self.pending_text += self.sink.push(token_id)
            if self.sink.stopped:
                return SequenceStatus.FINISHED_STOPPED
        if len(self.output_token_ids) >= params.max_tokens:
            return SequenceStatus.FINISHED_LENGTH
        return None

    def finish(self, status: SequenceStatus) -> None:
        self.status = status
        if self.sink is not None and status < SequenceStatus.FINISHED_ABORTED and not self.sink.stopped:
            self.pending_text += self.sink.flush()
