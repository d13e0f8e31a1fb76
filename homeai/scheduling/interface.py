"""The contract between the engine loop and whatever plans its steps.

The engine's step is three lines: ``plan = scheduler.schedule()``, ``output = runner.execute(plan)``,
``scheduler.update(plan, output)``. A scheduler owns the waiting and running sequences and the KV block
manager; it never touches tensors, so policies can be tested on virtual time with a cost-model runner.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import StepOutput, StepPlan
from homeai.policy.schema import Policy
from homeai.scheduling.clock import Clock
from homeai.scheduling.step_budget import ClassTargets
from homeai.scheduling.step_guard import PeerBounds


class StepScheduler(ABC):
    """Plans each forward pass over a flat batch and applies its results."""

    block_manager: BlockManager
    clock: Clock  # the time every plan is made on (virtual in tests and the simulator)
    model: str | None = None  # the model whose steps it plans (None: the only one)
    # The other models' interactive targets, set by the ModelSet it joins (None: alone on the device). A
    # scheduler that sizes steps by targets keeps its steps within these too; one that does not ignores it.
    peer_targets: Callable[[], list[ClassTargets]] | None = None
    # Their arrival bounds and token deadlines, which bound this model's steps where latency margins guard
    # them (``step_guard.PeerBounds``; None: alone on the device)
    peer_bounds: Callable[[], PeerBounds] | None = None

    def __init__(self) -> None:
        self.seqs: dict[int, Sequence] = {}
        # One thread owns a scheduler: the device loop (others post to its inbox, see DeviceLoop). The
        # lock only keeps a direct caller from another thread (a bench, a test) from tearing a step.
        self.lock = threading.RLock()

    # ---- what the batcher asks: the whole contract, so it never probes with getattr ---------------
    # Every scheduler answers each question itself: no neutral default lets one satisfy the batcher
    # while ignoring what it asks.
    # Queries: none of them mutates (the device thread may ask them any number of times per step).
    @abstractmethod
    def next_wake_s(self, after: float | None = None) -> float | None:
        """When queued work may become ready (a delay window closing, a timeout due); None: only when
        work arrives. With ``after``, only times later than it: what an idle loop sleeps until."""

    @abstractmethod
    def can_step(self, now: float) -> bool:
        """True when ``schedule()`` at ``now`` has something to do: a running sequence, an admission
        whose delay window is open, a timeout to apply. False means an LLM step now would be empty."""

    @abstractmethod
    def interactive_admission_ready(self, now: float) -> bool:
        """An interactive request may be admitted now (its first token is what its user waits for)."""

    @abstractmethod
    def has_waiting_interactive(self) -> bool:
        """Interactive requests wait in a queue, or interactive tokens that are due wait for the next step
        (background embedding work must not slow the LLM)."""

    @abstractmethod
    def admission_hold_s(self, now: float) -> float:
        """How long the waiting interactive work (``has_waiting_interactive``) may still wait behind
        background work; 0: it goes next."""

    @abstractmethod
    def interactive_active(self, now: float) -> bool:
        """Interactive work runs, or arrived recently enough that more is likely."""

    @abstractmethod
    def running_itl_targets_s(self) -> list[float]:
        """The inter-token-latency targets of the interactive classes with running sequences."""

    @abstractmethod
    def next_step_s(self) -> float | None:
        """The predicted length of the next LLM step while interactive classes decode (their latency
        margins bound what lower-class work adds to it); None: no prediction, assume a full step budget."""

    @abstractmethod
    def margin_intervals_s(self) -> list[float]:
        """For each running interactive class with a latency margin: the longest the time between two of
        its tokens may be, lower-class work between its steps included ((1 + margin) x its own step)."""

    @abstractmethod
    def claim(self, now: float) -> int | None:
        """The rank of the most important class a step now would serve (0 first; background classes rank
        after every interactive one, from ``BACKGROUND_RANK``); None: a step now would do nothing. With
        several models on the device, the model with the best claim steps first (``ModelSet``)."""

    @abstractmethod
    def interactive_targets(self, now: float) -> list[ClassTargets]:
        """The latency targets of this scheduler's interactive classes: another model's steps on the same
        device are sized by them too (a voice request waits for whatever step runs when it arrives)."""

    @abstractmethod
    def bounds_for_peers(self, now: float) -> PeerBounds:
        """What this scheduler's classes put on the other models' steps on the same device: while its
        interactive classes are active, their arrival bounds (a latency margin's ``arrival_step_fraction``
        of the TTFT target: a request of theirs arriving during another model's step waits for it), and
        the deadlines of its running classes' next tokens (their ITL targets from its last step's end)."""

    @abstractmethod
    def drain_rejected(self) -> list[Sequence]:
        """Sequences that timed out in a queue since the last call (finished: the engine answers them)."""

    @abstractmethod
    def apply_policy(self, policy: Policy) -> None:
        """Take a new policy's limits from the next step ."""

    @abstractmethod
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (it has no KV yet)."""

    def abort(self, request_id: str) -> Sequence | None:
        """Drop a sequence wherever it is; its KV blocks go back to the pool at once."""
        with self.lock:
            for seq in list(self.seqs.values()):
                if seq.request_id == request_id:
                    self._finish(seq, SequenceStatus.FINISHED_ABORTED)
                    return seq
            return None

    @abstractmethod
    def schedule(self) -> StepPlan:
        """Decide the next step: which chunks of which sequences run, and who is preempted to make room."""

    @abstractmethod
    def update(self, plan: StepPlan, output: StepOutput) -> list[Sequence]:
        """Apply a step's sampled tokens; return every sequence that produced a token or finished."""

    @abstractmethod
    def has_work(self) -> bool:
        """True while any sequence waits or runs."""

    @property
    @abstractmethod
    def num_waiting(self) -> int: ...

    @property
    @abstractmethod
    def num_running(self) -> int: ...

    def get(self, seq_id: int) -> Sequence:
        return self.seqs[seq_id]

    def seal(self, plan: StepPlan) -> StepPlan:
        """Give each chunk of a complete plan its sequence's block ids (what its KV is read from and
        written to) and the KV copy a newly admitted one needs first; a schedule() returns its plan through
        this. The lists are the block manager's own, not copies: nothing changes them between schedule() and
        update(), which runs on the same thread."""
        bm = self.block_manager
        for chunk in plan.chunks:
            chunk.block_table = bm.block_table(chunk.seq_id)
            chunk.kv_copy = bm.take_copy(chunk.seq_id)
        return plan

    def _apply_chunk(self, seq: Sequence, num_tokens: int, sampled: int | None, now_s: float) -> bool:
        """Advance a sequence by one executed chunk; return True when it finished. Shared by schedulers."""
        seq.num_computed_tokens += num_tokens
        self.block_manager.cache_blocks(seq)  # its full blocks now hold written KV: reusable by others
        if sampled is None:
            return False
        if seq.first_token_s is None:
            seq.first_token_s = now_s
        status = seq.append_token(sampled)
        if status is not None:
            self._finish(seq, status)
            return True
        return False

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        seq.finish(status)
        self.block_manager.free(seq.seq_id)
        self.seqs.pop(seq.seq_id, None)
        self._forget(seq)

    @abstractmethod
    def _forget(self, seq: Sequence) -> None:
        """Remove a finished sequence from the scheduler's own queues."""
