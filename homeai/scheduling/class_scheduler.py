"""In-flight batching over workload classes: the step planner of the product.

Each LLM class has its own Triton-style queue (priority levels, size limit, timeouts, delay window)
and its own VTC fairness counters. Every step re-plans:

1. running sequences first, most important class first: one decode token each, or the next chunk of
   a prompt (chunked prefill, so decodes never stall behind a long prompt);
2. then admissions, class by class in priority order (a background class that got less than its
   ``min_share`` of recent step tokens goes first), each class's next request coming from its user
   with the lowest virtual token counter, within the token budget, ``max_num_seqs``, the class's
   ``max_running`` and the KV pool. A more important class takes sequence slots or KV blocks from
   the least important running class by preemption (recompute later).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import ScheduledChunk, StepOutput, StepPlan
from homeai.policy.schema import ClassPolicy, Policy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem
from homeai.scheduling.clock import Clock, MonotonicClock
from homeai.scheduling.fairness import VirtualTokenCounter
from homeai.scheduling.interface import StepScheduler

INTERACTIVE_HORIZON_S = 10.0  # interactive work seen this recently keeps background chunks small
SHARE_WINDOW_STEPS = 64  # steps over which a background class's share is measured for min_share
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
    served_tokens: int = 0  # all-time, for stats
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=SHARE_WINDOW_STEPS))

    @property
    def rank(self) -> int:
        return self.policy.priority + (BACKGROUND_RANK if self.policy.background else 0)


class ClassScheduler(StepScheduler):
    """Plans LLM steps over the LLM classes of a policy (see the module docstring)."""

    def __init__(self, block_manager: BlockManager | None, policy: Policy, clock: Clock | None = None,
                 model: str | None = None) -> None:
        super().__init__()
        if block_manager is not None:
            self.block_manager = block_manager
        self.clock = clock or MonotonicClock()
        self.model = model
        self.classes: dict[str, LLMClassState] = {}
        self.running: list[Sequence] = []
        self.rejected: list[Sequence] = []  # timed out in a queue (REJECT): the engine fails them
        self.num_preemptions = 0
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
            item = QueuedItem(seq.request_id, seq.user, priority_level=seq.extra.get("priority_level"),
                              timeout_override_us=seq.extra.get("timeout_us"), cost=seq.num_prompt_tokens,
                              payload=seq)
            now = self.clock.now() if now is None else now
            self._expire(now)  # timed-out requests make room and are answered now, not in limbo
            newly = state.queue.num_queued_for(seq.user) == 0
            state.queue.push(item, now)
            if newly:
                state.vtc.on_backlogged(seq.user, state.queue.users_queued())
            seq.arrival_s = item.arrival_s
            if not state.policy.background:
                self.last_interactive_s = item.arrival_s
            seq.status = SequenceStatus.WAITING
            seq.extra["item"] = item
            self.seqs[seq.seq_id] = seq

    def _forget(self, seq: Sequence) -> None:
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
            if any(s.num_running for s in self.classes.values() if not s.policy.background):
                self.last_interactive_s = now
            self._interactive_now = self.interactive_active(now)
            self._prefill_used: dict[str, int] = {}
            plan = StepPlan()
            self._shed_over_limits(plan)
            self._schedule_running(plan, self.max_num_batched_tokens)
            self._admit(plan, now)
            self._record_shares(plan)
            return plan

    def _expire(self, now: float) -> None:
        for state in self.classes.values():
            for item in state.queue.expire(now):
                seq = item.payload
                if state.queue.num_queued_for(seq.user) == 0:
                    state.vtc.on_drained(seq.user)
                seq.extra["error"] = "queue timeout"
                seq.finish(SequenceStatus.FINISHED_ABORTED)
                self.seqs.pop(seq.seq_id, None)
                self.rejected.append(seq)

    def _rank(self, seq: Sequence) -> int:
        state = self.classes.get(seq.class_name)
        return state.rank if state is not None else BACKGROUND_RANK * 2

    def interactive_active(self, now: float) -> bool:
        """Interactive work runs, or arrived recently enough that more is likely."""
        return now - self.last_interactive_s <= INTERACTIVE_HORIZON_S

    def _chunk_cap(self, seq: Sequence) -> int:
        """Prompt tokens a sequence may take this step. Background classes: the whole budget when the
        house is quiet; while interactive classes are active, the class's prompt chunks together get
        its min_share of the budget (at least 32 tokens), so a step stays short and a voice request
        arriving meanwhile waits little. Decode tokens are never capped."""
        state = self.classes.get(seq.class_name)
        if seq.num_pending_tokens == 1 or state is None or not state.policy.background \
                or not self._interactive_now:
            return self.max_num_batched_tokens
        class_cap = max(32, int(self.max_num_batched_tokens * max(state.policy.min_share, 0.05)))
        return max(0, class_cap - self._prefill_used.get(state.name, 0))

    def _take_tokens(self, plan: StepPlan, seq: Sequence, n: int) -> None:
        plan.chunks.append(_chunk(seq, n))
        if n > 1:
            self._prefill_used[seq.class_name] = self._prefill_used.get(seq.class_name, 0) + n

    def _schedule_running(self, plan: StepPlan, budget: int) -> int:
        bm = self.block_manager
        scheduled: set[int] = set()
        order = sorted(self.running, key=lambda s: (self._rank(s), s.arrival_s, s.seq_id))
        decodes_left = sum(s.num_pending_tokens == 1 for s in order)
        for seq in order:
            if budget <= 0:
                break
            decodes_left -= seq.num_pending_tokens == 1
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this step
            # A prompt chunk leaves one token for every decode planned after it: chunked prefill must
            # never make a running decode wait, whichever class the long prompt belongs to.
            reserve = 0 if seq.num_pending_tokens == 1 else decodes_left
            n = max(0, min(seq.num_pending_tokens, budget - reserve, self._chunk_cap(seq)))
            if n == 0:
                continue
            while not bm.can_allocate(seq.seq_id, seq.num_computed_tokens + n):
                victim = self._victim(exclude=scheduled, max_rank=None)
                if victim is None:
                    break
                self._preempt(victim, plan)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING or not bm.can_allocate(seq.seq_id, seq.num_computed_tokens + n):
                continue
            bm.allocate(seq.seq_id, seq.num_computed_tokens + n)
            self._take_tokens(plan, seq, n)
            scheduled.add(seq.seq_id)
            budget -= n
        return budget

    def _shed_over_limits(self, plan: StepPlan) -> None:
        """A policy swap may lower max_num_seqs or a class's max_running below what runs: the excess
        (least important, newest first) goes back to the head of its queue, so the limits hold now."""
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
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        plan.preempted.append(seq.seq_id)
        for chunk in [c for c in plan.chunks if c.seq_id == seq.seq_id]:  # planned earlier this step
            plan.chunks.remove(chunk)
            if chunk.num_tokens > 1:
                self._prefill_used[seq.class_name] -= chunk.num_tokens
        item = seq.extra["item"]
        item.deadline_s = None  # the queue timeout bounds the wait before service, not a requeue
        state.queue.requeue_front(item)

    def _admission_order(self) -> list[LLMClassState]:
        return sorted(self.classes.values(), key=lambda c: (-1 if self._starved(c) else c.rank, c.policy.priority))

    def _starved(self, c: LLMClassState) -> bool:
        return c.policy.background and c.policy.min_share > 0 and len(c.queue) > 0 \
            and self._share(c) < c.policy.min_share

    def _share(self, state: LLMClassState) -> float:
        total = sum(sum(c.recent) for c in self.classes.values())
        return sum(state.recent) / total if total else 0.0

    def _admit(self, plan: StepPlan, now: float) -> None:
        bm = self.block_manager
        for state in self._admission_order():
            starved = self._starved(state)
            cap = state.policy.max_running
            while (budget := self.max_num_batched_tokens - plan.num_tokens) > 0 \
                    and (cap is None or state.num_running < cap):
                item = state.queue.peek_for_admission(now, state.vtc.pick)
                if item is None:
                    break
                seq: Sequence = item.payload
                cached = bm.lookup(seq)  # a prefix whose KV is cached is not computed again, nor charged
                n = min(seq.num_pending_tokens - cached, budget, self._chunk_cap(seq))
                if n == 0 or seq.seq_id in plan.preempted:  # preempted this step: not back in it
                    break
                if not self._make_room(seq, cached + n, state.rank, plan):
                    break
                state.queue.take(item, now)
                if state.queue.num_queued_for(seq.user) == 0:
                    state.vtc.on_drained(seq.user)
                seq.num_computed_tokens = bm.admit(seq, n)  # starts after its cached prefix
                seq.status = SequenceStatus.RUNNING
                # Admitted for its min_share: keeps its slot until it finishes, or more important
                # admissions would preempt it again and again and the share would buy no progress.
                seq.extra["min_share"] = starved
                self.running.append(seq)
                state.num_running += 1
                self._take_tokens(plan, seq, n)

    def _make_room(self, seq: Sequence, n: int, rank: int, plan: StepPlan) -> bool:
        """Free a sequence slot and KV blocks for an admission, preempting strictly less important
        classes only (even if already planned this step: their chunk is dropped), never one admitted for
        its class's min_share; False when that is not enough (the request keeps its place)."""
        bm = self.block_manager
        protected = {s.seq_id for s in self.running if s.extra.get("min_share")}
        while len(self.running) >= self.max_num_seqs or not bm.can_allocate(seq.seq_id, seq.num_computed_tokens + n):
            victim = self._victim(exclude=protected, max_rank=rank)
            if victim is None:
                return False
            self._preempt(victim, plan)
        return True

    def _record_shares(self, plan: StepPlan) -> None:
        per_class: dict[str, int] = {}
        for chunk in plan.chunks:
            name = self.seqs[chunk.seq_id].class_name
            per_class[name] = per_class.get(name, 0) + chunk.num_tokens
        for name, state in self.classes.items():
            state.recent.append(per_class.get(name, 0))

    # ---- results ---------------------------------------------------------------------------------
    def update(self, plan: StepPlan, output: StepOutput) -> list[Sequence]:
        with self.lock:
            now = self.clock.now()
            touched = []
            for chunk in plan.chunks:
                seq = self.seqs.get(chunk.seq_id)
                if seq is None:  # aborted while the step ran
                    continue
                state = self.classes[seq.class_name]
                fresh_prompt = max(0, min(chunk.start + chunk.num_tokens, seq.num_prompt_tokens)
                                   - max(chunk.start, seq.extra.get("charged_prompt", 0)))
                seq.extra["charged_prompt"] = seq.extra.get("charged_prompt", 0) + fresh_prompt
                sampled = output.sampled.get(chunk.seq_id) if chunk.sample else None
                state.vtc.charge(seq.user, fresh_prompt, 1 if sampled is not None else 0)
                state.served_tokens += chunk.num_tokens
                self._apply_chunk(seq, chunk.num_tokens, sampled, now)
                if sampled is not None:
                    touched.append(seq)
            return touched

    def class_stats(self) -> dict[str, dict[str, object]]:
        with self.lock:
            return {name: {"queued": len(s.queue), "running": s.num_running, "served_tokens": s.served_tokens,
                           "depth_by_level": s.queue.depth_by_level(), "fairness": s.vtc.snapshot()}
                    for name, s in self.classes.items()}


def _due(t: float | None, now: float) -> bool:
    return t is not None and t <= now


def _chunk(seq: Sequence, n: int) -> ScheduledChunk:
    start = seq.num_computed_tokens
    return ScheduledChunk(seq.seq_id, start, n, sample=start + n == seq.num_tokens)
