"""The few plain types that cross boundaries: sampling parameters, a token delta, a step plan and its output.

Nothing here imports torch, so the scheduler (which plans steps) stays free of the model runtime.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FinishReason(enum.StrEnum):
    """Why a sequence ended; values are the OpenAI finish reasons."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class ConstraintKind(enum.StrEnum):
    """What a constraint's ``spec`` holds."""

    JSON_SCHEMA = "json_schema"  # a JSON Schema (JSON text); the output is one instance of it
    JSON_OBJECT = "json_object"  # any JSON object (spec unused)
    STRUCTURAL_TAG = "structural_tag"  # xgrammar's structural tag (JSON text): tool calls among text


# A temperature below this samples greedily, as vLLM's _SAMPLING_EPS: dividing float32 logits by 1e-300 made
# every logit infinite (NaN after the softmax) and the answer end-of-text tokens.
GREEDY_BELOW_TEMPERATURE = 1e-5

@dataclass(frozen=True, slots=True)
class Constraint:
    """A grammar the output must follow. Hashable, so compiled grammars are cached per constraint."""

    kind: ConstraintKind
    spec: str = ""


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 means greedy."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # 1.0: off (CTRL-style, applied to prompt and output tokens)
    repeat_last_n: int = -1  # how many of the last prompt + output tokens it looks at: -1 all, 0 none (Ollama's)
    presence_penalty: float = 0.0  # OpenAI-style, output tokens only
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    constraint: Constraint | None = None  # None: unconstrained (pays nothing for grammars)
    logprobs: int | None = None  # None: none wanted; k >= 0: the sampled token's and k top alternatives

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


@dataclass(slots=True)
class TokenLogprob:
    """A sampled token's logprob and the ``top`` alternatives, all from the distribution it was drawn from."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class TokenDelta:
    """What a stream consumer receives after a step: new text (never a broken character or partial stop)."""

    request_id: str
    text: str
    token_ids: list[int]
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: FinishReason | None = None
    error: str | None = None
    timed_out: bool = False  # it waited in its queue past its timeout (the API answers 503)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token id, when asked for
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache, not computed (usage's cached_tokens)
    queue_s: float | None = None  # on the first delta after admission: how long it waited in its class queue

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class ScheduledChunk:
    """One sequence's share of a step: compute tokens [start, start + num_tokens) of its known tokens.

    There is no prefill or decode phase: a decode is a chunk of one token at the end; a prefill is a
    chunk of the prompt. ``sample`` is true when the chunk reaches the end of the known tokens, so the
    step must produce the sequence's next token. ``block_table`` holds the sequence's KV block ids as the
    plan leaves them (``StepScheduler.seal``): the runner reads and writes KV by them alone, so it never
    looks into the block manager the scheduler owns (vLLM's ``SchedulerOutput`` carries block ids too).
    ``kv_copy`` (source block, block of this sequence, slots): keys and values the runner copies before the
    chunk runs, where the sequence's cached prefix ends inside a block (``BlockManager``).
    """

    seq_id: int
    start: int
    num_tokens: int
    sample: bool
    block_table: list[int] = field(default_factory=list)  # set when the plan is complete
    kv_copy: tuple[int, int, int] | None = None  # set when the plan is complete


@dataclass(slots=True)
class StepPlan:
    """The scheduler's decision for one forward pass over a flat batch of chunks."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)  # seq ids sent back to waiting this step

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(slots=True)
class StepOutput:
    """What the runner produced: the next token for each sequence whose chunk sampled."""

    sampled: dict[int, int] = field(default_factory=dict)  # seq_id -> token id
    logprobs: dict[int, float] = field(default_factory=dict)  # seq_id -> logprob of the sampled token
    top_logprobs: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # seq_id -> when asked
