"""min_share for the LLM planner: a background class's share of each step, and what protects it.

A background class owed its ``min_share`` (credit in a ``ShareLedger``, refilled by min_share of each
step's token budget while it has work, capped at SHARE_BURST_STEPS steps' worth: no catch-up burst,
nothing owed at a cold start) gets this step's share of the budget (and of the sequence slots) left to
it by interactive work, and may spend the rest of its credit after it. The share also keeps a few
sequence slots (min_share of them, its oldest running sequences, while they hold at most min_share of
the KV pool): a more important admission cannot take those slots, and can take everything else a
background class holds, KV blocks included, so a background job admitted at a cold start never locks
voice out. While the house is active, a background class's prompt chunks stay at min_share of the
step's budget (at least BACKGROUND_CHUNK_TOKENS) unless every interactive class sets a latency margin:
then the margins and the arrival bound size them (``step_guard``).

What a share pass may add beyond those margins is a second credit, in device seconds (the step cost
model's price of the class's rows, prompt tokens and the context they read): min_share of the time that
passes while the class has work, at most SHARE_TIME_BURST_S of it, charged with everything the class is
served. Tokens alone undercount a summary's decode row, one token that reads ~1,800 tokens of context:
refilled with min_share of each step's token budget, the token credit was never spent, so every voice step
carried summary rows (voice's steps 11.3 ms under the household mix against 6.7 alone) while the summaries
took far more than their share on idle capacity anyway.

``ShareGuard`` holds that state for the class scheduler, which hands it what it needs call by call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import StepPlan
from homeai.scheduling.share_bucket import ShareLedger
from homeai.scheduling.step_budget import StepCostModel
from homeai.scheduling.step_guard import Work

if TYPE_CHECKING:
    from homeai.scheduling.class_scheduler import LLMClassState

BACKGROUND_CHUNK_TOKENS = 32  # a background class's prompt tokens per step while the house is active
SHARE_BURST_STEPS = 2  # a background class's share credit holds at most this many full steps' share
SHARE_TIME_BURST_S = 1.0  # its credit of time beyond the margins holds at most this long at its rate


class ShareGuard:
    """The min_share half of the class scheduler's planning (see the module docstring): the classes'
    share credit, the sequences holding a share this step, and the tokens each class took on it."""

    def __init__(self) -> None:
        self.ledger = ShareLedger(SHARE_BURST_STEPS)  # in tokens; a unit is a full step
        self.time = ShareLedger(SHARE_TIME_BURST_S)  # in predicted device seconds; a unit is a second
        self._time_at: float | None = None  # when the time credit was last refilled
        self.protected: dict[int, str] = {}  # share-holding sequences this step -> their class
        self.used: dict[str, int] = {}  # tokens each class took on its share, this step

    # ---- the step ---------------------------------------------------------------------------------
    def start_step(self) -> None:
        self.protected = {}
        self.used = {}

    def protect(self, classes: Iterable[LLMClassState], running: list[Sequence], bm: BlockManager,
                max_num_seqs: int) -> None:
        self.protected = share_protected(classes, running, bm, max_num_seqs)

    def owed(self, classes: Iterable[LLMClassState], budget: int, max_tokens: int) -> list[LLMClassState]:
        """Background classes with share credit, refilled by min_share of this step's ``budget`` while
        the class has work (no catch-up bursts, nothing owed at a cold start), most important first."""
        out = []
        for state in sorted(classes, key=lambda c: c.rank):
            share = state.policy.min_share if state.policy.background else 0.0
            if self.ledger.refill(state.name, share, budget, max_tokens,
                                  backlogged=bool(state.num_running or len(state.queue))):
                out.append(state)
        return out

    def credit(self, state: LLMClassState) -> int:
        return int(self.ledger.credit(state.name))

    def refill_time(self, classes: Iterable[LLMClassState], now: float) -> None:
        """Each background class earns min_share of the time since the last step while it has work."""
        elapsed = 0.0 if self._time_at is None else max(0.0, now - self._time_at)
        self._time_at = now
        for state in classes:
            share = state.policy.min_share if state.policy.background else 0.0
            self.time.refill(state.name, share, elapsed, 1.0, backlogged=bool(state.num_running or len(state.queue)))

    def seconds_credit(self, state: LLMClassState) -> float:
        """How long a share pass of ``state`` may make this step beyond the latency margins."""
        return max(0.0, self.time.credit(state.name))

    def reserve_tokens(self, owed: list[LLMClassState], budget: int) -> int:
        """Tokens of this step interactive work leaves to the owed background classes: each one's
        min_share of the budget (its rate), or its credit if less. What credit a class banked beyond
        that (at most SHARE_BURST_STEPS steps' worth) it may take only after interactive work."""
        return sum(min(self.credit(s), int(s.policy.min_share * budget)) for s in owed)

    def reserve_slots(self, owed: list[LLMClassState], max_num_seqs: int) -> int:
        """Sequence slots interactive admissions leave to the owed background classes with queued work:
        their share of the slots not yet held by a share-holding sequence (within max_running)."""
        out = 0
        for state in owed:
            if len(state.queue):
                cap = state.policy.max_running
                room = share_slots(state, max_num_seqs) - self._num_protected(state)
                out += max(0, room if cap is None else min(room, cap - state.num_running))
        return out

    def background_limit(self, state: LLMClassState, budget: int, interactive_now: bool) -> int | None:
        """While interactive classes are active, a background class's prompt chunks together stay small
        (its min_share of this step's budget, at least BACKGROUND_CHUNK_TOKENS, its share pass
        included): every token a step takes lengthens the wait of the next voice request, and idle
        capacity is not what an active house has. A quiet house gives background the whole budget."""
        if not state.policy.background or not interactive_now:
            return None
        cap = max(BACKGROUND_CHUNK_TOKENS, int(budget * state.policy.min_share))
        return max(0, cap - self.used.get(state.name, 0))

    # ---- what the planner reports -------------------------------------------------------------
    def admitted(self, state: LLMClassState, seq: Sequence, for_share: bool, max_num_seqs: int) -> None:
        """An admission on the share holds one of its slots while the share has slots left."""
        if for_share and self._num_protected(state) < share_slots(state, max_num_seqs):
            self.protected[seq.seq_id] = state.name

    def took(self, class_name: str, num_tokens: int) -> None:
        """``num_tokens`` more of this step went to ``class_name`` on its share (negative: given back)."""
        self.used[class_name] = max(0, self.used.get(class_name, 0) + num_tokens)

    def preempted(self, seq: Sequence) -> None:
        self.protected.pop(seq.seq_id, None)

    def charge(self, classes: Iterable[LLMClassState], plan: StepPlan, seqs: Mapping[int, Sequence],
               cost: StepCostModel, forced_s: Mapping[str, float]) -> None:
        """Charge each class's credits with what it got: tokens, and their predicted seconds. On its share
        (forced: ``used`` tokens, and ``forced_s``, what its share pass added, which may pass the margins
        and overdraw the credit by what it took), or on idle capacity (never below zero)."""
        work: dict[str, Work] = {}
        for chunk in plan.chunks:
            work.setdefault(seqs[chunk.seq_id].class_name, Work()).add(
                Work(chunk.num_tokens, 1, chunk.start + chunk.num_tokens))
        empty_s = cost.predict_s(0, 0, 0)
        for state in classes:
            w = work.get(state.name, Work())
            forced = min(self.used.get(state.name, 0), w.tokens)
            self.ledger.charge(state.name, forced, forced=True)
            self.ledger.charge(state.name, w.tokens - forced, forced=False)
            got_s = cost.predict_s(w.tokens, w.rows, w.ctx) - empty_s if w.rows else 0.0
            forced_time = min(max(0.0, forced_s.get(state.name, 0.0)), got_s)
            self.time.charge(state.name, forced_time, forced=True)
            self.time.charge(state.name, got_s - forced_time, forced=False)

    def _num_protected(self, state: LLMClassState) -> int:
        return sum(1 for name in self.protected.values() if name == state.name)


def share_slots(state: LLMClassState, max_num_seqs: int) -> int:
    """Sequence slots a background class's min_share keeps: at least one (0.05 of 16 slots rounded down to
    none, and the class never ran while interactive work kept every slot busy), and at most half of them:
    with ``max_num_seqs: 1`` that one slot went to the summaries, and voice timed out behind 15 of them."""
    share = state.policy.min_share
    if not state.policy.background or share <= 0:
        return 0
    return min(max(1, int(share * max_num_seqs)), max_num_seqs // 2)


def share_protected(classes: Iterable[LLMClassState], running: list[Sequence], bm: BlockManager,
                    max_num_seqs: int) -> dict[int, str]:
    """Running sequences that hold a background class's share and no more: its oldest, at most
    min_share of the sequence slots, while they hold at most min_share of the KV pool. A more
    important admission cannot take their slots (KV blocks it needs, it can); everything else a
    background class holds is preemptible, so it never locks voice out."""
    out: dict[int, str] = {}
    for state in classes:
        blocks_left = state.policy.min_share * bm.num_blocks
        mine = sorted((s for s in running if s.class_name == state.name), key=lambda s: (s.arrival_s, s.seq_id))
        for seq in mine[:share_slots(state, max_num_seqs)]:
            blocks_left -= len(bm.block_table(seq.seq_id))
            if blocks_left < 0:
                break
            out[seq.seq_id] = state.name
    return out
