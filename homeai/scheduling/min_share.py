"""min_share for the LLM planner: a background class's share of each step, and what protects it.

A background class owed its ``min_share`` (a ``ShareBucket`` refilled by min_share of each step's token
budget while it has work, capped at SHARE_BURST_STEPS steps' worth: no catch-up burst, nothing owed at a
cold start) gets that many tokens before more important classes' prompt chunks. The share also keeps a
few sequence slots (min_share of them, its oldest running sequences, while they hold at most min_share
of the KV pool): a more important admission cannot take those slots, and can take everything else a
background class holds, KV blocks included, so a background job admitted at a cold start never locks
voice out. While the house is active, a background class's prompt
chunks stay at min_share of the step's budget (at least BACKGROUND_CHUNK_TOKENS).

A mixin of ``ClassScheduler``: these methods read its classes, running sequences and block manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import StepPlan

if TYPE_CHECKING:
    from homeai.scheduling.class_scheduler import LLMClassState

BACKGROUND_CHUNK_TOKENS = 32  # a background class's prompt tokens per step while the house is active
SHARE_BURST_STEPS = 2  # a background class's share credit holds at most this many full steps' share


class MinShareMixin:
    """The min_share half of the class scheduler's planning (see the module docstring)."""

    classes: dict[str, LLMClassState]
    running: list[Sequence]
    seqs: dict[int, Sequence]
    block_manager: BlockManager
    max_num_seqs: int
    max_num_batched_tokens: int
    _budget: int
    _interactive_now: bool
    _protected: set[int]  # share-holding sequences, this step
    _share_used: dict[str, int]  # tokens each class took on its share, this step

    def _background_limit(self, state: LLMClassState) -> int | None:
        """While interactive classes are active, a background class's prompt chunks together stay small
        (its min_share of this step's budget, at least BACKGROUND_CHUNK_TOKENS, its share pass
        included): every token a step takes lengthens the wait of the next voice request, and idle
        capacity is not what an active house has. A quiet house gives background the whole budget."""
        if not state.policy.background or not self._interactive_now:
            return None
        cap = max(BACKGROUND_CHUNK_TOKENS, int(self._budget * state.policy.min_share))
        return max(0, cap - self._share_used.get(state.name, 0))

    def _owed_background(self) -> list[LLMClassState]:
        """Background classes with share credit, refilled by min_share of this step's budget while the
        class has work (a bucket: no catch-up bursts, nothing owed at a cold start)."""
        out = []
        for state in sorted(self.classes.values(), key=lambda c: c.rank):
            bucket = state.bucket
            bucket.share = state.policy.min_share if state.policy.background else 0.0
            bucket.set_capacity(SHARE_BURST_STEPS * bucket.share * self.max_num_batched_tokens)
            bucket.refill(self._budget, backlogged=bool(state.num_running or len(state.queue)))
            if bucket.owed:
                out.append(state)
        return out

    def _share_reserve(self, owed: list[LLMClassState]) -> int:
        """Tokens of this step interactive work leaves to the owed background classes: each one's
        min_share of the budget (its rate), or its credit if less. What credit a class banked beyond
        that (at most SHARE_BURST_STEPS steps' worth) it may take only after interactive work."""
        return sum(min(int(s.bucket.credit), int(s.policy.min_share * self._budget)) for s in owed)

    def _share_slots_reserve(self, owed: list[LLMClassState]) -> int:
        """Sequence slots interactive admissions leave to the owed background classes with queued work:
        their share of the slots not yet held by a share-holding sequence (within max_running)."""
        out = 0
        for state in owed:
            if len(state.queue):
                cap = state.policy.max_running
                room = self._share_slots(state) - self._num_protected(state)
                out += max(0, room if cap is None else min(room, cap - state.num_running))
        return out

    def _share_slots(self, state: LLMClassState) -> int:
        return int(state.policy.min_share * self.max_num_seqs) if state.policy.background else 0

    def _num_protected(self, state: LLMClassState) -> int:
        return sum(self.seqs[sid].class_name == state.name for sid in self._protected)

    def _share_protected(self) -> set[int]:
        """Running sequences that hold a background class's share and no more: its oldest, at most
        min_share of the sequence slots, while they hold at most min_share of the KV pool. A more
        important admission cannot take their slots (KV blocks it needs, it can); everything else a
        background class holds is preemptible, so it never locks voice out."""
        bm, out = self.block_manager, set()
        for state in self.classes.values():
            slots = self._share_slots(state)
            blocks_left = state.policy.min_share * bm.num_blocks
            mine = sorted((s for s in self.running if s.class_name == state.name),
                          key=lambda s: (s.arrival_s, s.seq_id))
            for seq in mine[:slots]:
                blocks_left -= len(bm.block_table(seq.seq_id))
                if blocks_left < 0:
                    break
                out.add(seq.seq_id)
        return out

    def _charge_shares(self, plan: StepPlan) -> None:
        """Charge each background class's bucket with what it got: on its share, or on idle capacity."""
        per_class: dict[str, int] = {}
        for chunk in plan.chunks:
            name = self.seqs[chunk.seq_id].class_name
            per_class[name] = per_class.get(name, 0) + chunk.num_tokens
        for name, state in self.classes.items():
            forced = min(self._share_used.get(name, 0), per_class.get(name, 0))
            state.bucket.charge(forced, forced=True)
            state.bucket.charge(per_class.get(name, 0) - forced, forced=False)
