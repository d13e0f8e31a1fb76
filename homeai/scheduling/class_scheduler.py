"""In-flight batching over workload classes: the step planner of the product.

Each LLM class has its own Triton-style queue (priority levels, size limit, timeouts, delay window)
and its own VTC fairness counters. Every step re-plans, within a token budget sized so that the step
ends within the latency targets of the active interactive classes (``step_budget``):

1. every running decode, most important class first (a due token never waits behind a prompt);
2. background classes owed their ``min_share`` (a refilling bucket, ``min_share``) get that many
   tokens: their running prompts' chunks, then admissions;
3. then class by class in importance order: the class's running prompt chunks, then its admissions,
   each next request coming from its user with the lowest virtual token counter (the prompt is charged
   at admission), within ``max_num_seqs``, the class's ``max_running`` and the KV pool. A waiting
   voice request is thus planned before a chat prompt's next chunk, which waits or gets what is left.
   A more important class takes sequence slots or KV blocks from the least important running class
   by preemption (recompute later), except what holds a background class's share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import ScheduledChunk, StepOutput, StepPlan
from homeai.policy.schema import ClassPolicy, Policy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem
from homeai.scheduling.clock import Clock, MonotonicClock
from homeai.scheduling.fairness import VirtualTokenCounter
from homeai.scheduling.interface import StepScheduler
from homeai.scheduling.min_share import MinShareMixin
from homeai.scheduling.share_bucket import ShareBucket
from homeai.scheduling.step_budget import MIN_STEP_TOKENS, ClassTargets, StepCostModel, step_token_budget

INTERACTIVE_HORIZON_S = 10.0  # interactive work seen this recently keeps steps sized by the targets
BACKGROUND_RANK = 1000  # background classes rank after every interactive class


class UnknownClassError(KeyError):
    """The request names a class this scheduler does not serve (the API maps it to 400)."""


@dataclass(slots=True)
class LLMClassState:
    name: str
    policy: ClassPolicy
    queue: ClassQueue
    vtc: VirtualTokenCounter
    num_running: int = 0
    served_tokens: int = 0  # all-time, for stats: tokens computed, recomputed ones included
    wasted_tokens: int = 0  # all-time: computed tokens a preemption threw away (computed again later)
    bucket: ShareBucket = field(default_factory=lambda: ShareBucket(0.0, 0.0))  # min_share credit, tokens

    @property
    def rank(self) -> int:
        return self.policy.priority + (BACKGROUND_RANK if self.policy.background else 0)


class ClassScheduler(MinShareMixin, StepScheduler):
    """Plans LLM steps over the LLM classes of a policy (see the module docstring)."""

    def __init__(self, block_manager: BlockManager | None, policy: Policy, clock: Clock | None = None,
                 model: str | None = None, step_cost: StepCostModel | None = None) -> None:
        super().__init__()
        # Fitted online from the steps' measured durations (schedule() to update() on this clock).
        self.step_cost = step_cost or StepCostModel()
        self._in_flight: tuple[float, int] | None = None
        self._budget = policy.scheduler.max_num_batched_tokens
        self._protected: set[int] = set()
        self._share_used: dict[str, int] = {}
        if block_manager is not None:
            self.block_manager = block_manager
        self.clock = clock or MonotonicClock()
        self.model = model
        self.classes: dict[str, LLMClassState] = {}
        self.running: list[Sequence] = []
        self.rejected: list[Sequence] = []  # timed out in a queue (REJECT): the engine fails them
        self.num_preemptions = 0
        self.num_futile_preemptions = 0  # preemptions that did not make the room they were made for
        self.num_wasted_tokens = 0  # computed tokens thrown away by preemptions
        self._num_reused: dict[int, int] = {}  # seq id -> prompt tokens its admission found cached
        self.last_interactive_s = float("-inf")  # last time an interactive class had work
        self._interactive_now = False
        self.apply_policy(policy)

    # ---- policy ----------------------------------------------------------------------------------
    def apply_policy(self, policy: Policy) -> None:
        """Swap limits atomically: queued requests keep their place; new limits apply from the next step."""
        with self.lock:
            self.policy = policy
            self.max_num_batched_tokens = policy.scheduler.max_num_batched_tokens
            self.max_num_seqs = policy.scheduler.max_num_seqs
            for name, cp in policy.classes.items():
                if cp.kind != "llm" or (self.model is not None and cp.model != self.model):
                    continue
                state = self.classes.get(name)
                if state is None:
                    self.classes[name] = LLMClassState(name, cp, ClassQueue(name, cp),
                                                       VirtualTokenCounter.from_policy(policy, name))
                else:
                    state.policy = cp
                    state.queue.set_policy(cp)
                    state.vtc.apply_policy(policy, name)

    # ---- requests --------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return sum(len(c.queue) for c in self.classes.values())

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.running) or any(len(c.queue) for c in self.classes.values()) or bool(self.rejected)

    def add(self, seq: Sequence, now: float | None = None) -> None:
        """Queue a sequence in its class; raises QueueFullError at once when its level is full.
        ``now`` lets a simulator stamp the true arrival of a request that came in during a step."""
        with self.lock:
            state = self.classes.get(seq.class_name)
            if state is None:
                raise UnknownClassError(f"class {seq.class_name!r} is not an LLM class of this model; "
                                        f"known: {sorted(self.classes)}")
            item = QueuedItem(seq.request_id, seq.user, priority_level=seq.priority_level,
                              timeout_override_us=seq.timeout_us, cost=seq.num_prompt_tokens,
                              payload=seq)
            now = self.clock.now() if now is None else now
            self._expire(now)  # timed-out requests make room and are answered now, not in limbo
            newly = state.queue.num_queued_for(seq.user) == 0
            state.queue.push(item, now, self._num_free_slots(state))
            if newly:
                state.vtc.on_backlogged(seq.user, state.queue.users_queued())
            seq.arrival_s = item.arrival_s
            if not state.policy.background:
                self.last_interactive_s = item.arrival_s
            seq.status = SequenceStatus.WAITING
            seq.queue_item = item
            self.seqs[seq.seq_id] = seq

    def _num_free_slots(self, state: LLMClassState) -> int:
        """Sequences of the class that could start now: within its ``max_running`` and ``max_num_seqs``."""
        free = self.max_num_seqs - len(self.running)
        cap = state.policy.max_running
        return max(0, free if cap is None else min(free, cap - state.num_running))

    def _forget(self, seq: Sequence) -> None:
        self._num_reused.pop(seq.seq_id, None)
        state = self.classes.get(seq.class_name)
        if seq in self.running:
            self.running.remove(seq)
            if state is not None:
                state.num_running -= 1
        elif state is not None and state.queue.cancel(seq.request_id) is not None:
            if state.queue.num_queued_for(seq.user) == 0:
                state.vtc.on_drained(seq.user)

    def next_wake_s(self, after: float | None = None) -> float | None:
        now = self.clock.now()
        with self.lock:
            times = [t for s in self.classes.values()
                     for t in (s.queue.next_ready_at(now), s.queue.next_expiry_at())
                     if t is not None and (after is None or t > after)]
        return min(times) if times else None

    def can_step(self, now: float) -> bool:
        with self.lock:
            if self.running or self.rejected:
                return True
            return any(self._admissible(s, now) or _due(s.queue.next_expiry_at(), now)
                       for s in self.classes.values())

    def interactive_admission_ready(self, now: float) -> bool:
        with self.lock:
            return len(self.running) < self.max_num_seqs and any(
                self._admissible(s, now) for s in self.classes.values() if not s.policy.background)

    def _admissible(self, state: LLMClassState, now: float) -> bool:
        """The class's delay window is open and its cap leaves room (a query: no timeouts applied)."""
        cap = state.policy.max_running
        return (cap is None or state.num_running < cap) and _due(state.queue.next_ready_at(now), now)

    def has_waiting_interactive(self) -> bool:
        with self.lock:
            return any(len(s.queue) for s in self.classes.values() if not s.policy.background)

    def running_itl_targets_s(self) -> list[float]:
        with self.lock:
            return [s.policy.targets.itl_ms / 1000.0 for s in self.classes.values()
                    if s.num_running and not s.policy.background and s.policy.targets is not None
                    and s.policy.targets.itl_ms]

    def drain_rejected(self) -> list[Sequence]:
        with self.lock:
            out, self.rejected = self.rejected, []
            return out

    # ---- planning --------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        with self.lock:
            now = self.clock.now()
            self._expire(now)
            if any(s.num_running or len(s.queue) for s in self.classes.values() if not s.policy.background):
                self.last_interactive_s = now
            self._interactive_now = self.interactive_active(now)
            self._budget = self.step_token_budget()
            self._share_used: dict[str, int] = {}
            plan = StepPlan()
            self._shed_over_limits(plan)  # 0. lowered caps hold from this step
            self._protected = self._share_protected()
            self._schedule_decodes(plan)  # 1. every running decode: tokens are due, and cheap
            # Decodes may pass the latency budget, but must not take all of it: where even a short step
            # outlasts the targets (a slow or busy CPU), prompts keep MIN_STEP_TOKENS beside the decodes,
            # or a waiting voice request would not be admitted until enough decodes finished.
            self._budget = max(self._budget, min(self.max_num_batched_tokens, plan.num_tokens + MIN_STEP_TOKENS))
            for state in self._owed_background():  # 2. background classes owed their min_share
                self._serve_class(plan, state, now, limit=int(state.bucket.credit), for_share=True)
            for state in sorted(self.classes.values(), key=lambda c: c.rank):  # 3. by class importance
                self._serve_class(plan, state, now, limit=self._background_limit(state), for_share=False)
            self._charge_shares(plan)
            self._in_flight = (now, plan.num_tokens)
            return plan

    def _expire(self, now: float) -> None:
        for state in self.classes.values():
            for item in state.queue.expire(now):
                seq = item.payload
                if state.queue.num_queued_for(seq.user) == 0:
                    state.vtc.on_drained(seq.user)
                seq.error = "queue timeout"
                seq.finish(SequenceStatus.FINISHED_TIMED_OUT)
                self.seqs.pop(seq.seq_id, None)
                self.rejected.append(seq)

    def _rank(self, seq: Sequence) -> int:
        state = self.classes.get(seq.class_name)
        return state.rank if state is not None else BACKGROUND_RANK * 2

    def interactive_active(self, now: float) -> bool:
        """Interactive work runs, or arrived recently enough that more is likely."""
        return now - self.last_interactive_s <= INTERACTIVE_HORIZON_S

    def step_token_budget(self) -> int:
        """This step's token budget, sized by the interactive classes' latency targets on this device's
        fitted step cost (see ``step_budget``); the configured maximum when no class has targets."""
        targets = [ClassTargets(c.policy.targets.ttft_ms / 1000 if c.policy.targets.ttft_ms else None,
                                c.policy.targets.itl_ms / 1000 if c.policy.targets.itl_ms else None,
                                running=c.num_running > 0, active=self._interactive_now)
                   for c in self.classes.values() if not c.policy.background]
        return step_token_budget(self.step_cost, self.max_num_batched_tokens, targets)

    def _room(self, plan: StepPlan) -> int:
        return min(self._budget, self.max_num_batched_tokens) - plan.num_tokens

    def _schedule_decodes(self, plan: StepPlan) -> None:
        """One token for every running sequence whose prompt is done, most important class first. They
        may pass the latency budget (a due token never waits) but never ``max_num_batched_tokens``."""
        order = sorted(self.running, key=lambda s: (self._rank(s), s.arrival_s, s.seq_id))
        for seq in order:
            if plan.num_tokens >= self.max_num_batched_tokens:
                break
            if seq.status == SequenceStatus.RUNNING and seq.num_pending_tokens == 1 \
                    and self._grow(seq, 1, plan) == 1:
                plan.chunks.append(_chunk(seq, 1))

    def _grow(self, seq: Sequence, n: int, plan: StepPlan) -> int:
        """KV for up to ``n`` tokens of a running sequence beyond those computed; returns how many it
        got. While the pool is short, the least important running sequence gives way (one planned this
        step only if it is less important than ``seq``: its chunk is dropped; a background share keeps
        its slots, not its blocks). When ``seq`` itself is the one to give way, it first takes the chunk
        that fits; only when not one token fits is it preempted (two prompts that each fit the pool
        alone would otherwise preempt each other forever)."""
        bm, rank = self.block_manager, self._rank(seq)
        victims = 0
        while not bm.can_allocate(seq.seq_id, seq.num_computed_tokens + n):
            keep = {c.seq_id for c in plan.chunks if self._rank(self.seqs[c.seq_id]) <= rank} - {seq.seq_id}
            victim = self._victim(exclude=keep, max_rank=None)
            if victim is None or victim is seq:
                fit = (len(bm.block_table(seq.seq_id)) + bm.num_free_blocks) * bm.block_size \
                    - seq.num_computed_tokens
                if 1 <= fit < n:
                    n = fit
                    continue
                self.num_futile_preemptions += victims
                if victim is seq:
                    self._preempt(seq, plan)
                return 0
            self._preempt(victim, plan)
            victims += 1
        bm.allocate(seq.seq_id, seq.num_computed_tokens + n)
        return n

    def _serve_class(self, plan: StepPlan, state: LLMClassState, now: float, limit: int | None,
                     for_share: bool) -> None:
        """Prompt chunks for the class's running prefills, then its admissions, within the room left in
        the budget (and ``limit`` tokens, for a min_share pass). Going class by class pauses a less
        important class's running prefill while a more important class waits."""
        taken = 0

        def room() -> int:
            r = self._room(plan)
            return r if limit is None else min(r, limit - taken)

        for seq in sorted((s for s in self.running if s.class_name == state.name),
                          key=lambda s: (s.arrival_s, s.seq_id)):
            if seq.num_pending_tokens == 1:
                continue  # a decode: planned already
            planned = self._planned_tokens(plan, seq)  # a chunk from the min_share pass grows
            n = min(seq.num_pending_tokens - planned, room())
            if n <= 0:
                if room() <= 0:
                    return
                continue
            if seq.status == SequenceStatus.RUNNING:
                n = self._grow(seq, planned + n, plan) - planned
                if n > 0:
                    self._take_tokens(plan, seq, n, for_share)
                    taken += n
        cap = state.policy.max_running
        while (n_room := room()) > 0 and (cap is None or state.num_running < cap):
            item = state.queue.peek_for_admission(now, state.vtc.pick)
            if item is None:
                return
            seq: Sequence = item.payload
            cached = self.block_manager.lookup(seq)  # a prefix whose KV is cached is not computed again
            n = min(seq.num_pending_tokens - cached, n_room)
            if seq.seq_id in plan.preempted:  # preempted this step: not back in it
                return
            if not self._make_room(seq, cached + n, state.rank, plan):
                return
            self._admit_one(state, item, seq, n, now, plan, for_share)
            taken += n

    def _admit_one(self, state: LLMClassState, item: QueuedItem, seq: Sequence, n: int, now: float,
                   plan: StepPlan, for_share: bool) -> None:
        state.queue.take(item, now)
        seq.num_computed_tokens = self.block_manager.admit(seq, n)  # starts after its cached prefix
        self._num_reused[seq.seq_id] = seq.num_computed_tokens
        # VTC charges the prompt at admission (as the paper does): the next pick in this very step
        # already sees it, so one user cannot fill a step while its counter stands still. A cached
        # prefix costs nothing to serve, so it is not charged.
        fresh = seq.num_prompt_tokens - max(seq.num_charged_prompt_tokens, seq.num_computed_tokens)
        if fresh > 0:
            state.vtc.charge(seq.user, fresh, 0)
            seq.num_charged_prompt_tokens = seq.num_prompt_tokens
        if state.queue.num_queued_for(seq.user) == 0:
            state.vtc.on_drained(seq.user)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        state.num_running += 1
        if for_share and self._num_protected(state) < self._share_slots(state):
            self._protected.add(seq.seq_id)
        self._take_tokens(plan, seq, n, for_share)

    @staticmethod
    def _planned(plan: StepPlan) -> set[int]:
        return {c.seq_id for c in plan.chunks}

    @staticmethod
    def _planned_tokens(plan: StepPlan, seq: Sequence) -> int:
        return sum(c.num_tokens for c in plan.chunks if c.seq_id == seq.seq_id)

    def _take_tokens(self, plan: StepPlan, seq: Sequence, n: int, for_share: bool) -> None:
        """Plan ``n`` more tokens of ``seq``: a new chunk, or the one planned earlier, grown."""
        planned = self._planned_tokens(plan, seq)
        plan.chunks[:] = [c for c in plan.chunks if c.seq_id != seq.seq_id]
        plan.chunks.append(_chunk(seq, planned + n))
        if for_share:
            self._share_used[seq.class_name] = self._share_used.get(seq.class_name, 0) + n

    def _shed_over_limits(self, plan: StepPlan) -> None:
        """A policy swap may lower max_num_seqs or a class's max_running below what runs: the excess
        (least important, newest first) goes back to the head of its queue, so the limits hold now."""
        self._protected = set()
        for state in self.classes.values():
            cap = state.policy.max_running
            while cap is not None and state.num_running > cap:
                mine = [s for s in self.running if s.class_name == state.name]
                self._preempt(max(mine, key=lambda s: (s.arrival_s, s.seq_id)), plan)
        while len(self.running) > self.max_num_seqs:
            victim = self._victim(exclude=set(), max_rank=None)
            assert victim is not None
            self._preempt(victim, plan)

    def _victim(self, exclude: set[int], max_rank: int | None) -> Sequence | None:
        """The least important running sequence (newest first), of rank above ``max_rank`` if given."""
        candidates = [s for s in self.running if s.seq_id not in exclude
                      and (max_rank is None or self._rank(s) > max_rank)]
        if not candidates:
            return None
        return max(candidates, key=lambda s: (self._rank(s), s.arrival_s, s.seq_id))

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.block_manager.free(seq.seq_id)
        self.running.remove(seq)
        state = self.classes[seq.class_name]
        state.num_running -= 1
        wasted = max(0, seq.num_computed_tokens - self._num_reused.pop(seq.seq_id, 0))
        state.wasted_tokens += wasted
        self.num_wasted_tokens += wasted
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        plan.preempted.append(seq.seq_id)
        self._protected.discard(seq.seq_id)
        for chunk in [c for c in plan.chunks if c.seq_id == seq.seq_id]:  # planned earlier this step
            plan.chunks.remove(chunk)
            if seq.class_name in self._share_used:
                self._share_used[seq.class_name] = max(0, self._share_used[seq.class_name] - chunk.num_tokens)
        item = seq.queue_item
        assert isinstance(item, QueuedItem)
        item.deadline_s = None  # the queue timeout bounds the wait before service, not a requeue
        state.queue.requeue_front(item)

    def _make_room(self, seq: Sequence, n: int, rank: int, plan: StepPlan) -> bool:
        """Free a sequence slot and KV blocks for an admission, preempting strictly less important
        classes only (even if already planned this step: their chunk is dropped); a sequence that holds
        a background class's share keeps its slot, never KV blocks a more important class needs. False
        when that is not enough (the request keeps its place)."""
        bm = self.block_manager
        victims = 0
        while True:
            short_of_slots = len(self.running) >= self.max_num_seqs
            if not short_of_slots and bm.can_allocate(seq.seq_id, seq.num_computed_tokens + n):
                return True
            victim = self._victim(exclude=self._protected if short_of_slots else set(), max_rank=rank)
            if victim is None:
                self.num_futile_preemptions += victims
                return False
            self._preempt(victim, plan)
            victims += 1

    # ---- results ---------------------------------------------------------------------------------
    def update(self, plan: StepPlan, output: StepOutput) -> list[Sequence]:
        with self.lock:
            now = self.clock.now()
            if self._in_flight is not None:
                start_s, num_tokens = self._in_flight
                self.step_cost.observe(num_tokens, now - start_s)
                self._in_flight = None
            touched = []
            for chunk in plan.chunks:
                seq = self.seqs.get(chunk.seq_id)
                if seq is None:  # aborted while the step ran
                    continue
                state = self.classes[seq.class_name]
                sampled = output.sampled.get(chunk.seq_id) if chunk.sample else None
                if sampled is not None:  # the prompt was charged at admission; output as generated
                    state.vtc.charge(seq.user, 0, 1)
                state.served_tokens += chunk.num_tokens
                self._apply_chunk(seq, chunk.num_tokens, sampled, now)
                if sampled is not None:
                    touched.append(seq)
            return touched

    def class_stats(self) -> dict[str, dict[str, object]]:
        with self.lock:
            return {name: {"queued": len(s.queue), "running": s.num_running, "served_tokens": s.served_tokens,
                           "wasted_tokens": s.wasted_tokens,
                           "depth_by_level": s.queue.depth_by_level(), "fairness": s.vtc.snapshot()}
                    for name, s in self.classes.items()}


def _due(t: float | None, now: float) -> bool:
    return t is not None and t <= now


def _chunk(seq: Sequence, n: int) -> ScheduledChunk:
    start = seq.num_computed_tokens
    return ScheduledChunk(seq.seq_id, start, n, sample=start + n == seq.num_tokens)
