"""How much lower-class work a step may carry: the latency margin of the interactive classes.

A step's length is set by everything in it: on a CPU twelve background decodes and a prompt chunk can
triple a voice decode step. So an interactive class with a ``latency_margin`` m is served as in a quiet
house: while a step carries its work (decode rows or a prompt chunk), the work of less important classes
may make that step at most (1 + m) times as long as the step would be without it — the step's length
predicted by the planner's fitted cost model from its rows, tokens and context
(``StepCostModel.predict_s``). Priority order decides between two interactive classes: chat's work in a
voice step is lower-class work for voice, background work in a chat step is lower-class work for chat.

While the house is active (interactive work running, waiting or seen lately), a voice request may also
arrive during a step that carries none of its work; it then waits for that step to end. Background work
is therefore also bounded by the interactive classes' arrival bound: a step may grow with background
work only up to ``arrival_step_fraction`` of their TTFT target (never below a step of MIN_STEP_TOKENS
rows), or to the interactive work already in it if that is longer.

``StepGuard`` keeps, per step, the work planned by class rank and answers how many more tokens a row of
a given class may add. A min_share pass may pass the bound by its share of the step's time (each of its
tokens priced with its context, as every row is here; ``ClassScheduler._share_seconds``):
a share is a guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from homeai.scheduling.step_budget import MIN_STEP_TOKENS, StepCostModel


@dataclass(slots=True, frozen=True)
class MarginClass:
    """An interactive class whose steps are guarded this step."""

    rank: int
    margin: float | None  # None: its steps are not guarded (it has no latency_margin)
    arrival_s: float | None  # the longest a background-only step may last while it is active; None: no bound


@dataclass(slots=True, frozen=True)
class PeerBounds:
    """What the other models on the device put on this model's steps: their interactive classes' arrival
    bounds (background work here is what their next request, arriving meanwhile, waits behind) and their
    running classes' token deadlines (rank, seconds from now: a step here must end by then, as their next
    step, and token, waits behind it)."""

    margins: list[MarginClass]
    deadlines: list[tuple[int, float]]


@dataclass(slots=True)
class Work:
    tokens: int = 0
    rows: int = 0
    ctx: int = 0

    def add(self, other: Work, sign: int = 1) -> None:
        self.tokens += sign * other.tokens
        self.rows += sign * other.rows
        self.ctx += sign * other.ctx


class StepGuard:
    """The work of one step by class rank, and the bounds the guarded classes put on lower-class work."""

    def __init__(self, cost: StepCostModel, background_rank: int) -> None:
        self.cost = cost
        self.background_rank = background_rank
        self.classes: list[MarginClass] = []
        self.deadlines: list[tuple[int, float]] = []
        self.by_rank: dict[int, Work] = {}

    def start(self, classes: list[MarginClass], deadlines: list[tuple[int, float]] | None = None) -> None:
        """A new step: ``classes`` guard lower-class work by their margins and arrival bounds;
        ``deadlines`` (rank, seconds): a class whose tokens are due within that long, so that prompts of
        its own class and less important work may only make the step that long (its decode rows may)."""
        self.classes = sorted(classes, key=lambda c: c.rank)
        self.deadlines = deadlines or []
        self.by_rank = {}

    @property
    def guarded(self) -> bool:
        return bool(self.classes)

    def add(self, rank: int, tokens: int, rows: int, ctx: int) -> None:
        self.by_rank.setdefault(rank, Work()).add(Work(tokens, rows, ctx))

    @property
    def prompt_guarded(self) -> bool:
        """A guarded class has prompt tokens in the step (more tokens than rows)."""
        return any(c.margin is not None and (w := self.by_rank.get(c.rank)) is not None and w.tokens > w.rows
                   for c in self.classes)

    def seconds(self, max_rank: int | None = None) -> float:
        """Predicted length of the step with the work of ranks up to ``max_rank`` (None: all of it)."""
        w = Work()
        for rank, work in self.by_rank.items():
            if max_rank is None or rank <= max_rank:
                w.add(work)
        return self.cost.predict_s(w.tokens, w.rows, w.ctx)

    def has_work(self, rank: int) -> bool:
        w = self.by_rank.get(rank)
        return w is not None and w.tokens > 0

    def floor_s(self) -> float:
        """The shortest bound: a step of MIN_STEP_TOKENS rows (where even that outlasts a target, as on a
        slow CPU, a shorter step would not meet it either)."""
        return self.cost.step_s(MIN_STEP_TOKENS)

    def cap_s(self, rank: int, decode: bool = False) -> float:
        """The longest the step may last once work of class rank ``rank`` is added to it (``decode``: a
        decode row, which a deadline of its own class does not hold back: it is what is due)."""
        cap = math.inf
        for r, deadline in self.deadlines:
            if rank > r or (rank == r and not decode):
                cap = min(cap, max(deadline, self.floor_s()))
        for c in self.classes:
            if c.rank >= rank:
                break
            if c.margin is not None and self.has_work(c.rank):
                cap = min(cap, (1.0 + c.margin) * self.seconds(c.rank))
            if c.arrival_s is not None and rank >= self.background_rank:
                cap = min(cap, max(c.arrival_s, self.floor_s(), self.seconds(self.background_rank - 1)))
        return cap

    def tokens_fit(self, rank: int, start: int, planned: int, decode: bool = False,
                   extra_s: float = 0.0) -> int | None:
        """How many tokens a row of class rank ``rank`` may add to the step within the bounds (None: no
        bound). ``start``: where its chunk starts in its sequence; ``planned``: tokens of it already in
        the step (0: a new row, which also costs the row); ``decode``: it is a decode row; ``extra_s``:
        seconds it may pass the bounds by (a min_share pass's share of the step)."""
        cap = self.cap_s(rank, decode)
        if cap == math.inf or extra_s == math.inf:
            return None
        c = self.cost
        left = cap + extra_s - self.seconds() + 1e-12
        per = c.prompt_token_s + c.per_ctx_s  # type: ignore[operator]
        if planned:
            return max(0, int(left / per))
        first = c.per_token_s + c.per_ctx_s * (start + 1)
        if left < first:
            return 0
        return 1 + int((left - first) / per)
