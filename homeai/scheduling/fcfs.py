"""First-come-first-served continuous batching with a token budget (the baseline Ollama-like order).

Each step: running sequences first (a decode token each, or the next chunk of a long prompt), then
waiting sequences in arrival order while the token budget, the sequence cap and the KV pool allow.
When the pool runs dry, the most recently arrived running sequence is preempted (recompute later).
"""

from __future__ import annotations

from collections import deque

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import ScheduledChunk, StepOutput, StepPlan
from homeai.policy.schema import Policy
from homeai.scheduling.clock import Clock, MonotonicClock
from homeai.scheduling.interface import StepScheduler
from homeai.scheduling.step_budget import ClassTargets
from homeai.scheduling.step_guard import PeerBounds


class FCFSScheduler(StepScheduler):
    def __init__(self, block_manager: BlockManager, max_num_batched_tokens: int = 512,
                 max_num_seqs: int = 64, clock: Clock | None = None) -> None:
        super().__init__()
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.clock = clock or MonotonicClock()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- the batcher's questions: FCFS has no classes, targets or timeouts, so every sequence is alike:
    # a step is worth running while anything waits or runs, and nothing is interactive to protect.
    def next_wake_s(self, after: float | None = None) -> float | None:
        return None  # no delay windows or timeouts: only new work wakes it

    def can_step(self, now: float) -> bool:
        return self.has_work()

    def interactive_admission_ready(self, now: float) -> bool:
        return self.has_work()

    def has_waiting_interactive(self) -> bool:
        return False

    def admission_hold_s(self, now: float) -> float:
        return 0.0

    def interactive_active(self, now: float) -> bool:
        return False

    def running_itl_targets_s(self) -> list[float]:
        return []

    def next_step_s(self) -> float | None:
        return None  # no cost model: the batcher assumes a full step budget

    def margin_intervals_s(self) -> list[float]:
        return []

    def claim(self, now: float) -> int | None:
        return 0 if self.can_step(now) else None

    def interactive_targets(self, now: float) -> list[ClassTargets]:
        return []

    def bounds_for_peers(self, now: float) -> PeerBounds:
        return PeerBounds([], [])

    def drain_rejected(self) -> list[Sequence]:
        return []  # nothing waits with a deadline

    def apply_policy(self, policy: Policy) -> None:
        return None  # a policy's classes and limits are the class scheduler's; FCFS keeps its budget

    def add(self, seq: Sequence) -> None:
        with self.lock:
            seq.status = SequenceStatus.WAITING
            seq.arrival_s = self.clock.now()
            self.seqs[seq.seq_id] = seq
            self.waiting.append(seq)

    def _forget(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq.seq_id)
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> StepPlan:
        with self.lock:
            return self.seal(self._schedule())

    def _schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        # 1. Running sequences, oldest first; make KV room by preempting the newest.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_pending_tokens, budget)
            while not bm.can_allocate(seq.seq_id, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                plan.preempted.append(victim.seq_id)
                if victim is seq:
                    break
            if seq.status == SequenceStatus.PREEMPTED:
                break
            bm.allocate(seq.seq_id, seq.num_computed_tokens + n)
            plan.chunks.append(self._chunk(seq, n))
            budget -= n
            i += 1
        # 2. Waiting sequences in arrival order, unless this step already had to preempt.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not plan.preempted:
            seq = self.waiting[0]
            cached = bm.lookup(seq)  # a prefix whose KV is cached is not computed again
            n = min(seq.num_pending_tokens - cached, budget)
            if not bm.can_allocate(seq.seq_id, cached + n):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = bm.admit(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            plan.chunks.append(self._chunk(seq, n))
            budget -= n
        return plan

    @staticmethod
    def _chunk(seq: Sequence, n: int) -> ScheduledChunk:
        start = seq.num_computed_tokens
        return ScheduledChunk(seq.seq_id, start, n, sample=start + n == seq.num_tokens)

    def update(self, plan: StepPlan, output: StepOutput) -> list[Sequence]:
        with self.lock:
            self.block_manager.release_pins()  # the step ran: its KV copies are done
            return self._update(plan, output)

    def _update(self, plan: StepPlan, output: StepOutput) -> list[Sequence]:
        now = self.clock.now()
        touched = []
        for chunk in plan.chunks:
            seq = self.seqs.get(chunk.seq_id)
            if seq is None:  # aborted while the step ran
                continue
            sampled = output.sampled.get(chunk.seq_id) if chunk.sample else None
            self._apply_chunk(seq, chunk.num_tokens, sampled, now)
            if sampled is not None:
                touched.append(seq)
        return touched
