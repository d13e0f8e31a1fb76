"""In-flight batching over workload classes: the step planner of the product.

Each LLM class has its own Triton-style queue (priority levels, size limit, timeouts, delay window)
and its own VTC fairness counters. Every step re-plans, within a token budget sized so that the step
ends within the latency targets of the active interactive classes (``step_budget``):

1. every running decode, most important class first (a due token never waits behind a prompt);
2. interactive classes in importance order: the class's running prompt chunks, then its admissions,
   each next request coming from its user with the lowest virtual token counter (the prompt is charged
   at admission), within ``max_num_seqs``, the class's ``max_running`` and the KV pool. A waiting
   voice request is thus planned before a chat prompt's next chunk, which waits or gets what is left.
   They leave the owed background classes this step's share of the budget (and of the sequence
   slots), never more: a share is a rate, and a voice prompt never waits behind banked credit;
3. background classes owed their ``min_share`` (refilling credit, ``min_share``) get that many
   tokens: their running prompts' chunks, then admissions;
4. what is left, class by class in importance order (background fills idle capacity).

An interactive class with a ``latency_margin`` is served as in a quiet house (``step_guard``): while a
step carries its work, the rows and prompt tokens of less important classes (chat's for voice, the
background's for both) may make it at most (1 + margin) times as long as its own work, by the fitted
cost model (``StepCostModel.predict_s``: rows, tokens, context); a background row it has no room for waits
for a later step (least recently served first), background rows come after the interactive prompts, and
a min_share pass passes the margins by its rate only. While the house is active a background-only step
lasts at most the classes' arrival bound, and a running class's own new prompts keep its next token
within its ITL target. Without margins (a policy that sets none) background prompt chunks keep the
older limit (min_share of the budget, at least BACKGROUND_CHUNK_TOKENS, while the house is active).

A more important class takes sequence slots or KV blocks from the least important running class by
preemption (recompute later), except what holds a background class's share: the victims are chosen
first and preempted only if together they make the room (a preemption that makes none only throws
computed tokens away). An admission asks KV for its whole prompt, below the most important class with
headroom left, and none is made in a step for a class as or less important than one refused KV or a
slot: it would take what that one waits for, and be preempted for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import ScheduledChunk, StepOutput, StepPlan
from homeai.engine.errors import ClassRetiredError
from homeai.policy.schema import ClassPolicy, Policy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem
from homeai.scheduling.clock import Clock, MonotonicClock
from homeai.scheduling.fairness import VirtualTokenCounter
from homeai.scheduling.interface import StepScheduler
from homeai.scheduling.min_share import ShareGuard, share_protected
from homeai.scheduling.preemption import blocks_freed, blocks_short, importance, plan_victims, victim_order
from homeai.scheduling.step_budget import (
    INTERACTIVE_HORIZON_S,
    ITL_STEP_FRACTION,
    MIN_STEP_TOKENS,
    ClassTargets,
    StepCostModel,
    step_time_limit,
    step_token_budget,
)
from homeai.scheduling.step_guard import MarginClass, PeerBounds, StepGuard
from homeai.scheduling.step_trace import StepTrace

BACKGROUND_RANK = 1000  # background classes rank after every interactive class
NO_RANK = 10 * BACKGROUND_RANK  # after every class
# An interactive decode row that a more important class's latency margin keeps out of the step waits at
# most this part of its own class's ITL target; then it runs in spite of the margin (the rest of the
# target is for the step that carries it). Priority decides between voice and chat; it does not starve chat.
DUE_ITL_FRACTION = 0.5
# Below the most important class an admission leaves this much of the KV pool free: room for the next
# voice request and the running decodes' next blocks without preempting (and so recomputing) anyone.
ADMISSION_HEADROOM = 0.05


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
    retired: str | None = None  # why a policy swap took the class off this scheduler (it drains, then goes)

    @property
    def rank(self) -> int:
        return self.policy.priority + (BACKGROUND_RANK if self.policy.background else 0)


@dataclass(slots=True)
class StepContext:
    """What one ``schedule()`` call works out as it plans, read by its passes: a new one every step, so
    nothing of it carries into the next by accident. The last step's stays readable between steps: the
    batcher asks which interactive rows a margin kept out of it (``deferred``)."""

    interactive_now: bool = False  # interactive work runs, waits or was seen lately (the house is active)
    limit_s: float | None = None  # the step's time bound by the interactive targets (None: none)
    itl_limit_s: float | None = None  # the bound by their ITL targets alone (what a decode step may last)
    budget: int = 0  # the step's token budget
    blocked_rank: int = NO_RANK  # the most important class refused KV or a slot in this step
    reserved_slots: int = 0  # sequence slots interactive admissions leave to owed background shares
    deferred: set[int] = field(default_factory=set)  # decode rows a latency margin kept out (so far)


class ClassScheduler(StepScheduler):
    """Plans LLM steps over the LLM classes of a policy (see the module docstring)."""

    def __init__(self, block_manager: BlockManager | None, policy: Policy, clock: Clock | None = None,
                 model: str | None = None, step_cost: StepCostModel | None = None) -> None:
        super().__init__()
        # Fitted online from the steps' measured durations (schedule() to update() on this clock).
        self.step_cost = step_cost or StepCostModel()
        self._in_flight: tuple[float, int, int, int] | None = None  # (start, tokens, rows, context)
        self.guard = StepGuard(self.step_cost, BACKGROUND_RANK)  # latency margins: lower-class work per step
        self._last_served: dict[int, int] = {}  # seq id -> the step that last ran a chunk of it
        self._last_token_s: dict[int, float] = {}  # seq id -> when its last token came out (this clock)
        self._num_steps = 0
        self.last_step_s: float | None = None  # the last planned step's predicted length
        self._last_step_end_s: float | None = None  # when the last step's results came back
        self._trace = StepTrace.from_env()  # HOMEAI_STEP_TRACE: a line per step, predicted and measured
        self._last_own_s: dict[int, float] = {}  # rank -> last step's predicted length with work of ranks <= it
        self._step = StepContext(budget=policy.scheduler.max_num_batched_tokens)  # the step planned last
        self.shares = ShareGuard()  # min_share: credit, share-holding sequences, tokens taken on shares
        if block_manager is not None:
            self.block_manager = block_manager
        self.clock = clock or MonotonicClock()
        self.model = model
        self.classes: dict[str, LLMClassState] = {}
        self.running: list[Sequence] = []
        self.rejected: list[Sequence] = []  # timed out in a queue (REJECT): the engine fails them
        self.num_preemptions = 0
        self._top_rank = 0  # the most important class's rank
        self.num_futile_preemptions = 0  # preemptions that did not make the room they were made for
        self.num_wasted_tokens = 0  # computed tokens thrown away by preemptions
        self._num_reused: dict[int, int] = {}  # seq id -> prompt tokens its admission found cached
        self.last_interactive_s = float("-inf")  # last time an interactive class had work
        # The interactive targets of the other models on this device (``ModelSet``): a step here delays
        # their requests too, so it is sized by their targets as by this model's own.
        self.peer_targets: Callable[[], list[ClassTargets]] | None = None
        # ... and, where latency margins guard its steps, by their arrival bounds and token deadlines
        self.peer_bounds: Callable[[], PeerBounds] | None = None
        self.apply_policy(policy)

    # ---- policy ----------------------------------------------------------------------------------
    def apply_policy(self, policy: Policy) -> None:
        """Swap limits atomically: queued requests keep their place; new limits apply from the next step.

        A class the new policy no longer serves here (removed, now an embedding class, or moved to
        another model) is retired: ``add`` refuses it, its targets stop sizing steps, its queued
        requests that never ran are rejected at once with the reason (``drain_rejected``), and what
        already ran (running, or preempted and waiting to resume) finishes, under the class's new
        limits where it still has some (a class moved to another model), else its last ones. Then it
        goes. A class that comes back while it drains is served again."""
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
                    self._refresh(state, policy)
                    state.retired = None
            for name, state in self.classes.items():
                reason = self._retired_reason(name, policy)
                if reason is not None and state.retired is None:
                    if name in policy.classes and policy.classes[name].kind == "llm":
                        self._refresh(state, policy)  # moved to another model: its new limits hold here too
                    state.retired = reason
                    self._reject_unstarted(state)
            self._drop_retired()
            self._top_rank = min((s.rank for s in self.classes.values() if s.retired is None), default=0)

    def _refresh(self, state: LLMClassState, policy: Policy) -> None:
        cp = policy.classes[state.name]
        state.policy = cp
        state.queue.set_policy(cp)
        state.vtc.apply_policy(policy, state.name)

    def _retired_reason(self, name: str, policy: Policy) -> str | None:
        cp = policy.classes.get(name)
        if cp is None:
            return f"class {name!r} was removed by a policy change"
        if cp.kind != "llm":
            return f"class {name!r} is now an embedding class"
        if self.model is not None and cp.model != self.model:
            return f"class {name!r} now runs on model {cp.model!r}, not {self.model!r}"
        return None

    def _reject_unstarted(self, state: LLMClassState) -> None:
        """Reject the queued requests of a retired class that never ran (nothing was streamed yet)."""
        for item in list(state.queue):
            seq: Sequence = item.payload
            if seq.num_preemptions or seq.num_output_tokens:
                continue  # it streamed already: it resumes and finishes
            state.queue.cancel(item.request_id)
            if state.queue.num_queued_for(seq.user) == 0:
                state.vtc.on_drained(seq.user)
            seq.error = state.retired
            seq.refusal = ClassRetiredError(f"{state.retired}; send the request again")  # 503, not an engine error
            seq.finish(SequenceStatus.FINISHED_ABORTED)
            self.seqs.pop(seq.seq_id, None)
            self.rejected.append(seq)

    def _drop_retired(self) -> None:
        for name in [n for n, s in self.classes.items() if s.retired and not s.num_running and not len(s.queue)]:
            del self.classes[name]

    # ---- requests --------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return sum(len(c.queue) for c in self.classes.values())

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        # a snapshot of the classes: other threads ask (the residency thread), a policy swap may change them
        return bool(self.running) or any(len(c.queue) for c in list(self.classes.values())) or bool(self.rejected)

    def add(self, seq: Sequence, now: float | None = None) -> None:
        """Queue a sequence in its class; raises QueueFullError at once when its level is full.
        ``now`` lets a simulator stamp the true arrival of a request that came in during a step."""
        with self.lock:
            state = self.classes.get(seq.class_name)
            if state is None or state.retired is not None:
                known = sorted(n for n, s in self.classes.items() if s.retired is None)
                why = state.retired if state is not None else \
                    f"class {seq.class_name!r} is not an LLM class of this model"
                raise UnknownClassError(f"{why}; known: {known}")
            item = QueuedItem(seq.request_id, seq.user, priority_level=seq.priority_level,
                              timeout_override_us=seq.timeout_us, cost=seq.num_prompt_tokens,
                              payload=seq)
            now = self.clock.now() if now is None else now
            self._expire(now)  # timed-out requests make room and are answered now, not in limbo
            newly = state.queue.num_queued_for(seq.user) == 0
            state.queue.push(item, now, self._num_free_slots(state))
            self._reject_pushed_out(state)
            if newly:
                state.vtc.on_backlogged(seq.user, state.queue.users_queued(), self._num_running_for(state, seq.user))
            seq.arrival_s = item.arrival_s
            if not state.policy.background:
                self.last_interactive_s = item.arrival_s
            seq.status = SequenceStatus.WAITING
            seq.queue_item = item
            self.seqs[seq.seq_id] = seq

    def _forget_idle_users(self) -> None:
        """Each class's VTC counters of users with nothing queued or running, where they outnumber the active
        ones (``VirtualTokenCounter.forget_idle``): checked each step by a length, pruned now and then."""
        for state in self.classes.values():
            if len(state.vtc) > state.vtc.prune_above:
                state.vtc.forget_idle(state.queue.users_queued() | {s.user for s in self.running
                                                                    if s.class_name == state.name})

    def _reject_pushed_out(self, state: LLMClassState) -> None:
        """Requests a full queue pushed out for another user's: rejected with the queue's 429."""
        for item, refusal in state.queue.take_pushed_out():
            seq: Sequence = item.payload
            if state.queue.num_queued_for(seq.user) == 0:
                state.vtc.on_drained(seq.user)
            seq.error, seq.refusal = str(refusal), refusal
            seq.finish(SequenceStatus.FINISHED_ABORTED)
            self.seqs.pop(seq.seq_id, None)
            self.rejected.append(seq)

    def _num_running_for(self, state: LLMClassState, user: str) -> int:
        return sum(s.user == user and s.class_name == state.name for s in self.running)

    def _num_free_slots(self, state: LLMClassState) -> int:
        """Sequences of the class that could start at the next step, within its ``max_running`` and
        ``max_num_seqs``: slots free or held by less important classes (preemption frees those, except
        a background share's), less those that more important classes' queued requests will take."""
        protected = share_protected(self.classes.values(), self.running, self.block_manager, self.max_num_seqs)
        held = sum(self._rank(s) <= state.rank or s.seq_id in protected for s in self.running)
        ahead = 0
        for other in self.classes.values():
            if other.rank < state.rank and len(other.queue):
                cap = other.policy.max_running
                ahead += len(other.queue) if cap is None else min(len(other.queue), max(0, cap - other.num_running))
        free = self.max_num_seqs - held - ahead
        cap = state.policy.max_running
        return max(0, free if cap is None else min(free, cap - state.num_running))

    def _forget(self, seq: Sequence) -> None:
        self._num_reused.pop(seq.seq_id, None)
        self._last_served.pop(seq.seq_id, None)
        self._last_token_s.pop(seq.seq_id, None)
        state = self.classes.get(seq.class_name)
        if seq in self.running:
            self.running.remove(seq)
            if state is not None:
                state.num_running -= 1
        elif state is not None and state.queue.cancel(seq.request_id) is not None:
            if state.queue.num_queued_for(seq.user) == 0:
                state.vtc.on_drained(seq.user)
        if state is not None and state.retired:
            self._drop_retired()  # its last request may have ended

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

    def claim(self, now: float) -> int | None:
        with self.lock:
            if self.rejected or any(_due(s.queue.next_expiry_at(), now) for s in self.classes.values()):
                return 0  # timeouts to answer: nobody should wait on those
            ranks = [s.rank for s in self.classes.values() if s.num_running or self._admissible(s, now)]
            return min(ranks, default=None)

    def interactive_admission_ready(self, now: float) -> bool:
        with self.lock:
            return len(self.running) < self.max_num_seqs and any(
                self._admissible(s, now) for s in self.classes.values() if not s.policy.background)

    def _admissible(self, state: LLMClassState, now: float) -> bool:
        """The class's delay window is open and its cap leaves room (a query: no timeouts applied)."""
        cap = state.policy.max_running
        return (cap is None or state.num_running < cap) and _due(state.queue.next_ready_at(now), now)

    def has_waiting_interactive(self) -> bool:
        """Interactive requests wait in a queue or for the rest of their prompt, or interactive decode
        rows a latency margin kept out of the last step wait for the next (their tokens are due)."""
        with self.lock:
            return any(len(s.queue) for s in self.classes.values() if not s.policy.background) \
                or any(self._rank(s) < BACKGROUND_RANK and (s.seq_id in self._step.deferred or (
                    s.num_pending_tokens > 1 and self.classes[s.class_name].policy.latency_margin is not None))
                    for s in self.running)

    def admission_hold_s(self, now: float) -> float:
        """How long the waiting interactive work may still wait behind background work: a request of a
        class with a latency margin that already decodes (its next step is due within its ITL target
        anyway) may wait up to its arrival bound (``arrival_step_fraction`` of its TTFT target) counted
        from its arrival, as if it had arrived during a background step; anything else waits for nothing
        (0): a class without a margin or none of its own running, a request preempted once, a decode row
        a margin kept out of the last step (its token is due). inf: nothing waits."""
        with self.lock:
            hold = float("inf")
            for c in self.classes.values():
                if c.policy.background:
                    continue
                mine = [s for s in self.running if s.class_name == c.name]
                prefills = [s for s in mine if s.num_pending_tokens > 1]
                if not len(c.queue) and not prefills:
                    continue
                fraction = c.policy.arrival_fraction
                if fraction is None or len(prefills) == len(mine):
                    return 0.0
                bound = fraction * c.policy.targets.ttft_ms / 1000.0  # type: ignore[operator]
                oldest = c.queue.oldest_arrival_s()
                arrivals = [s.arrival_s for s in prefills] + ([oldest] if oldest is not None else [])
                if any(s.num_preemptions for s in prefills):
                    return 0.0
                hold = min(hold, bound - (now - min(arrivals)))
            if any(self._rank(s) < BACKGROUND_RANK for s in self.running if s.seq_id in self._step.deferred):
                return 0.0
            return max(0.0, hold)

    def running_itl_targets_s(self) -> list[float]:
        with self.lock:
            return [s.policy.targets.itl_ms / 1000.0 for s in self.classes.values()
                    if s.num_running and not s.policy.background and s.policy.targets is not None
                    and s.policy.targets.itl_ms]

    def next_step_s(self) -> float | None:
        with self.lock:
            running = [c for c in self.classes.values() if c.num_running and not c.policy.background]
            if not running or any(c.policy.latency_margin is None for c in running):
                return None
            return self.last_step_s

    def margin_intervals_s(self) -> list[float]:
        with self.lock:
            if self.last_step_s is None:
                return []
            return [(1.0 + c.policy.latency_margin) * self._last_own_s.get(c.rank, self.last_step_s)
                    for c in self.classes.values()
                    if c.num_running and not c.policy.background and c.policy.latency_margin is not None
                    and c.policy.margin_between_steps]

    def drain_rejected(self) -> list[Sequence]:
        with self.lock:
            out, self.rejected = self.rejected, []
            return out

    # ---- planning --------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        with self.lock:
            now = self.clock.now()
            self._expire(now)
            self._drop_retired()
            self._forget_idle_users()
            if any(s.num_running or len(s.queue) for s in self.classes.values() if not s.policy.background):
                self.last_interactive_s = now
            step = self._step = StepContext(interactive_now=self.interactive_active(now))
            targets = self._step_targets()
            step.limit_s = step_time_limit(targets)
            itls = [ITL_STEP_FRACTION * t.itl_s for t in targets if t.itl_s]
            step.itl_limit_s = min(itls) if itls else None
            step.budget = step_token_budget(self.step_cost, self.max_num_batched_tokens, targets)
            self.shares.start_step()
            self.shares.refill_time(self.classes.values(), now)
            plan = StepPlan()
            self.guard.cost = self.step_cost
            margins = self._margin_classes()
            peers = self.peer_bounds() if self.peer_bounds is not None else None
            if peers is not None:  # the other models' classes on this device, as if they were this model's
                margins += peers.margins
            deadlines = self._deadlines(now) + (peers.deadlines if peers is not None else [])
            self.guard.start(margins, deadlines if margins else None)
            self._shed_over_limits(plan)  # 0. lowered caps hold from this step
            self.shares.protect(self.classes.values(), self.running, self.block_manager, self.max_num_seqs)
            self._schedule_decodes(plan, now)  # 1. every running decode: tokens are due, and cheap
            # Decodes may pass the latency budget, but must not take all of it: where even a short step
            # outlasts the targets (a slow or busy CPU), prompts keep MIN_STEP_TOKENS beside the decodes,
            # or a waiting voice request would not be admitted until enough decodes finished.
            step.budget = max(step.budget, min(self.max_num_batched_tokens, plan.num_tokens + MIN_STEP_TOKENS))
            owed = self.shares.owed(self.classes.values(), step.budget, self.max_num_batched_tokens)
            by_rank = sorted(self.classes.values(), key=lambda c: c.rank)
            interactive = [c for c in by_rank if not c.policy.background]
            # 2. interactive work first, leaving this step's share of the budget to the owed background
            # classes (their rate, never a burst of credit: a voice prompt never waits behind that)
            leave = self.shares.reserve_tokens(owed, step.budget)
            step.reserved_slots = self.shares.reserve_slots(owed, self.max_num_seqs)
            for state in interactive:
                self._serve_class(plan, state, now, limit=None, for_share=False, leave=leave)
            step.reserved_slots = 0
            forced_s: dict[str, float] = {}
            for state in owed:  # 3. background classes owed their min_share (its rate passes the margins)
                before_s = self.guard.seconds()
                self._serve_class(plan, state, now, limit=self.shares.credit(state), for_share=True,
                                  share_s=min(self._share_seconds(state), self.shares.seconds_credit(state)))
                forced_s[state.name] = self.guard.seconds() - before_s
            blunt = self._blunt_background_limit()
            for state in by_rank:  # 4. what is left, by class importance
                limit = self.shares.background_limit(state, step.budget, step.interactive_now) if blunt else None
                self._serve_class(plan, state, now, limit=limit, for_share=False)
            if plan.is_empty and step.deferred:  # the bounds never leave a step with running work empty
                self._force_one_deferred(plan)
            if plan.is_empty:
                self._force_progress(plan, now, by_rank)
            self.shares.charge(self.classes.values(), plan, self.seqs, self.step_cost, forced_s)
            self._finish_plan(plan, now)
            return self.seal(plan)

    def _share_seconds(self, state: LLMClassState) -> float:
        """The most a min_share pass may add beyond the latency margins (within its time credit, which
        ``ShareGuard`` keeps: min_share of the device's time, as a rate): min_share of the step's time bound
        (``step_time_limit``), its tokens priced as every row is (a prompt token, and the context it
        reads). A share of the token budget instead is a share of decode rows: on a CPU a prompt token
        costs many times a row, and 5 % of a 2,048-token budget taken as a summary's prompt chunk tripled
        voice's steps; a share in tokens without their context let four summary tokens at 1,700 tokens of
        context (~2.3 ms each, the cache they read) into every voice step: voice's 12th token at 2.2x its
        quiet-house time."""
        limit_s = self._step.limit_s
        if limit_s is None:
            return math.inf
        if self.guard.prompt_guarded and self._step.itl_limit_s is not None:
            # A guarded class's prompt is in the step, bounded by its TTFT target (a longer bound than a
            # decode step's): the share stays what a decode step of the house would give it.
            limit_s = min(limit_s, self._step.itl_limit_s)
        return min(state.policy.min_share, 1.0) * limit_s

    def _finish_plan(self, plan: StepPlan, now: float) -> None:
        """What the next step and the batcher learn from this plan: when each sequence last ran, the
        step's predicted length (all of it, and with the work of each rank and above)."""
        self._num_steps += 1
        rows = len(plan.chunks)
        ctx = sum(c.start + c.num_tokens for c in plan.chunks)
        for c in plan.chunks:
            self._last_served[c.seq_id] = self._num_steps
        self._in_flight = (now, plan.num_tokens, rows, ctx)
        self.last_step_s = self.guard.seconds() if rows else None
        self._last_own_s = {rank: self.guard.seconds(rank) for rank in self.guard.by_rank}

    def _margin_classes(self) -> list[MarginClass]:
        """The interactive classes whose latency_margin bounds lower-class work this step (a retired class
        keeps its margin for what still runs; no request of it can arrive any more)."""
        out = []
        for c in self.classes.values():
            p = c.policy
            if p.background or p.latency_margin is None or (c.retired and not c.num_running):
                continue
            fraction = p.arrival_fraction
            arrival = None
            if fraction is not None and self._step.interactive_now and not c.retired:
                arrival = fraction * p.targets.ttft_ms / 1000.0  # type: ignore[operator]
            out.append(MarginClass(c.rank, p.latency_margin, arrival))
        return out

    def bounds_for_peers(self, now: float) -> PeerBounds:
        with self.lock:
            margins = [MarginClass(c.rank, None, c.policy.arrival_fraction * c.policy.targets.ttft_ms / 1000.0)
                       for c in self.classes.values() if not c.policy.background and not c.retired
                       and c.policy.arrival_fraction is not None and c.policy.targets.ttft_ms] \
                if self.interactive_active(now) else []
            return PeerBounds(margins, self._deadlines(now))

    def _deadlines(self, now: float) -> list[tuple[int, float]]:
        """Running interactive classes' next tokens are due by their ITL target, counted from the last
        step's end (background batches may have run since): prompts of their own class and less important
        work may only make this step end by then (never shorter than a step of MIN_STEP_TOKENS rows)."""
        since = max(0.0, now - self._last_step_end_s) if self._last_step_end_s is not None else 0.0
        return [(c.rank, c.policy.targets.itl_ms / 1000.0 - since) for c in self.classes.values()
                if c.num_running and not c.policy.background and c.policy.targets.itl_ms]

    def _blunt_background_limit(self) -> bool:
        """Background prompt chunks keep the older blunt limit (min_share of the budget, at least
        BACKGROUND_CHUNK_TOKENS, while the house is active) unless every interactive class sets a
        latency_margin: then the margins and the arrival bound size them."""
        return any(not c.policy.background and c.policy.latency_margin is None and not c.retired
                   for c in self.classes.values())

    def _force_one_deferred(self, plan: StepPlan) -> None:
        for seq in sorted((s for s in self.running if s.seq_id in self._step.deferred),
                          key=lambda s: (self._rank(s), self._last_served.get(s.seq_id, 0), s.arrival_s, s.seq_id)):
            if seq.status == SequenceStatus.RUNNING and self._grow(seq, 1, plan) == 1:
                self._add_chunk(plan, seq, 1)
                self._step.deferred.discard(seq.seq_id)
                return

    def _force_progress(self, plan: StepPlan, now: float, by_rank: list[LLMClassState]) -> None:
        """Bounds that leave nothing to plan never stall the device: where the fitted cost says that not
        even one more prompt token fits (a fit skewed by steps another process slowed, over a long
        prompt's context), the most important class with work gets MIN_STEP_TOKENS tokens, unbounded by
        the margins and deadlines. An empty plan runs no step, so the fit would never change and the
        requests would wait forever."""
        if not self.running and not any(len(s.queue) for s in by_rank):
            return
        self.guard.start([], None)
        for state in by_rank:
            self._serve_class(plan, state, now, limit=MIN_STEP_TOKENS, for_share=False)
            if not plan.is_empty:
                return

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
        return state.rank if state is not None else NO_RANK

    def interactive_active(self, now: float) -> bool:
        """Interactive work runs, or arrived recently enough that more is likely."""
        return now - self.last_interactive_s <= INTERACTIVE_HORIZON_S

    def step_token_budget(self) -> int:
        """This step's token budget, sized by the interactive classes' latency targets on this device's
        fitted step cost (see ``step_budget``); the configured maximum when no class has targets."""
        return step_token_budget(self.step_cost, self.max_num_batched_tokens, self._step_targets())

    def _step_targets(self) -> list[ClassTargets]:
        targets = self._targets(self._step.interactive_now)
        if self.peer_targets is not None:
            targets += self.peer_targets()
        return targets

    def interactive_targets(self, now: float) -> list[ClassTargets]:
        with self.lock:
            return self._targets(self.interactive_active(now))

    def _targets(self, active: bool) -> list[ClassTargets]:
        # A retired class's running sequences keep their ITL target; no request of it can arrive any more.
        return [ClassTargets(c.policy.targets.ttft_ms / 1000 if c.policy.targets.ttft_ms and not c.retired else None,
                             c.policy.targets.itl_ms / 1000 if c.policy.targets.itl_ms else None,
                             running=c.num_running > 0, active=active)
                for c in self.classes.values() if not c.policy.background and (not c.retired or c.num_running)]

    def _room(self, plan: StepPlan) -> int:
        return min(self._step.budget, self.max_num_batched_tokens) - plan.num_tokens

    def _schedule_decodes(self, plan: StepPlan, now: float) -> None:
        """One token for every running sequence whose prompt is done, most important class first. They
        may pass the latency budget (a due token never waits) but never ``max_num_batched_tokens``. Under
        latency margins an interactive row a more important class's margin has no room for waits, but only
        until it is due (``DUE_ITL_FRACTION`` of its own ITL target since its last token)."""
        order = sorted(self.running, key=lambda s: (self._rank(s), self._last_served.get(s.seq_id, 0),
                                                    s.arrival_s, s.seq_id))
        for seq in order:
            if plan.num_tokens >= self.max_num_batched_tokens:
                break
            if seq.status != SequenceStatus.RUNNING or seq.num_pending_tokens != 1:
                continue
            # Under latency margins a background row comes after the interactive prompts (its class's
            # pass), and a row a margin has no room for waits for a later step (least served first).
            if self.guard.guarded and (self._is_background(seq) or not (self._fits(seq, 1) or self._due(seq, now))):
                self._step.deferred.add(seq.seq_id)
                continue
            if self._grow(seq, 1, plan) == 1:
                self._add_chunk(plan, seq, 1)

    def _due(self, seq: Sequence, now: float) -> bool:
        """The row has waited ``DUE_ITL_FRACTION`` of its class's ITL target since its last token."""
        targets = self.classes[seq.class_name].policy.targets
        last = self._last_token_s.get(seq.seq_id)
        return targets is not None and bool(targets.itl_ms) and last is not None \
            and now - last >= DUE_ITL_FRACTION * targets.itl_ms / 1000.0  # type: ignore[operator]

    def _is_background(self, seq: Sequence) -> bool:
        return self._rank(seq) >= BACKGROUND_RANK

    def _fits(self, seq: Sequence, n: int) -> bool:
        fit = self.guard.tokens_fit(self._rank(seq), seq.num_computed_tokens, 0, decode=True) \
            if self.guard.guarded else None
        return fit is None or fit >= n

    def _add_chunk(self, plan: StepPlan, seq: Sequence, n: int) -> None:
        """Plan ``n`` tokens of ``seq`` (none planned yet) and count them in the step's shape."""
        chunk = _chunk(seq, n)
        plan.chunks.append(chunk)
        self.guard.add(self._rank(seq), n, 1, chunk.start + n)

    def _grow(self, seq: Sequence, n: int, plan: StepPlan) -> int:
        """KV for up to ``n`` tokens of a running sequence beyond those computed; returns how many it
        got. While the pool is short, less important running sequences give way (one planned this step
        only if its class is less important than ``seq``'s: its chunk is dropped; a background share
        keeps its slots, not its blocks) — only as many as it takes, and only when that makes room:
        where even all of them cannot cover ``n`` tokens, ``seq`` gets what they and the free pool can.
        A sequence with nothing below it waits (its KV kept) rather than give way itself: whoever is more
        important takes its blocks when they need them, so nothing is thrown away for nobody."""
        bm, rank = self.block_manager, self._rank(seq)
        tokens = seq.num_computed_tokens + n
        if bm.can_allocate(seq.seq_id, tokens):
            bm.allocate(seq.seq_id, tokens)
            return n
        keep = {c.seq_id for c in plan.chunks if self._rank(self.seqs[c.seq_id]) <= rank}
        mine = importance(seq, self._rank)
        below = [s for s in victim_order(self.running, self._rank, keep | {seq.seq_id})
                 if importance(s, self._rank) > mine]
        victims = plan_victims(bm, self.running, below, blocks_short(bm, seq, tokens), need_slot=False)
        if victims is None:  # not enough below it: as many tokens as it and the free pool can hold
            held = (len(bm.block_table(seq.seq_id)) + bm.num_free_blocks + blocks_freed(bm, self.running, below)) \
                * bm.block_size
            n = min(n, held - seq.num_computed_tokens)
            if n < 1:
                self._note_blocked(rank)
                return 0
            tokens = seq.num_computed_tokens + n
            victims = plan_victims(bm, self.running, below, blocks_short(bm, seq, tokens), need_slot=False)
            self._note_blocked(rank)
        for victim in victims or []:
            self._preempt(victim, plan)
        if not bm.can_allocate(seq.seq_id, tokens):  # a cached prefix shared with a victim: rare
            self.num_futile_preemptions += len(victims or [])
            self._note_blocked(rank)
            return 0
        bm.allocate(seq.seq_id, tokens)
        return n

    def _serve_class(self, plan: StepPlan, state: LLMClassState, now: float, limit: int | None,
                     for_share: bool, leave: int = 0, share_s: float = 0.0) -> None:
        """Decode rows a latency margin kept out of the step so far (least recently served first), then
        prompt chunks for the class's running prefills, then its admissions, within the room left in the
        budget less ``leave`` tokens (and ``limit`` tokens, for a min_share pass) and within the latency
        margins of the more important classes in the step (``StepGuard``; a min_share pass may pass them
        by ``share_s`` seconds, its share of this step). Going class by class pauses a less important
        class's running prefill while a more important class waits."""
        taken = 0
        share_from = self.guard.seconds()

        def beyond() -> float:  # seconds this pass may still pass the margins by
            return max(0.0, share_s - (self.guard.seconds() - share_from)) if for_share else 0.0

        def room(start: int | None = None, planned: int = 0) -> int:
            r = self._room(plan) - leave
            if limit is not None:
                r = min(r, limit - taken)
            if start is not None and self.guard.guarded:
                fit = self.guard.tokens_fit(state.rank, start, planned, extra_s=beyond())
                if fit is not None:
                    r = min(r, fit)
            return r

        mine = [s for s in self.running if s.class_name == state.name]
        if self._step.deferred:  # decode rows: past the budget as all decodes, within the margins and limit
            for seq in sorted((s for s in mine if s.seq_id in self._step.deferred),
                              key=lambda s: (self._last_served.get(s.seq_id, 0), s.arrival_s, s.seq_id)):
                if plan.num_tokens >= self.max_num_batched_tokens or (limit is not None and taken >= limit):
                    break
                fit = self.guard.tokens_fit(state.rank, seq.num_computed_tokens, 0, decode=True, extra_s=beyond())
                if seq.status != SequenceStatus.RUNNING or (fit is not None and fit < 1):
                    continue
                if self._grow(seq, 1, plan) == 1:
                    self._take_tokens(plan, seq, 1, for_share)
                    self._step.deferred.discard(seq.seq_id)
                    taken += 1
        for seq in sorted(mine, key=lambda s: (s.arrival_s, s.seq_id)):
            if seq.num_pending_tokens == 1:
                continue  # a decode: planned already (or above)
            planned = self._planned_tokens(plan, seq)  # a chunk from the min_share pass grows
            n = min(seq.num_pending_tokens - planned, room(seq.num_computed_tokens, planned))
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
        while room() > 0 and (cap is None or state.num_running < cap):
            item = state.queue.peek_for_admission(now, state.vtc.pick)
            if item is None:
                return
            seq = item.payload  # a Sequence: what the engine queues in an LLM class
            cached = self.block_manager.lookup(seq)  # a prefix whose KV is cached is not computed again
            n = min(seq.num_pending_tokens - cached, room(cached))
            if n <= 0 or seq.seq_id in plan.preempted or state.rank >= self._step.blocked_rank:
                return  # no room within the margins; preempted this step: not back in it; or what it
                # needs, a waiting sequence needs
            if not self._make_room(seq, cached + n, state, plan):
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
        if seq.admitted_s is None:
            seq.admitted_s = now
        self.running.append(seq)
        state.num_running += 1
        self.shares.admitted(state, seq, for_share, self.max_num_seqs)
        self._take_tokens(plan, seq, n, for_share)

    @staticmethod
    def _planned_tokens(plan: StepPlan, seq: Sequence) -> int:
        return sum(c.num_tokens for c in plan.chunks if c.seq_id == seq.seq_id)

    def _take_tokens(self, plan: StepPlan, seq: Sequence, n: int, for_share: bool) -> None:
        """Plan ``n`` more tokens of ``seq``: a new chunk, or the one planned earlier, grown."""
        planned = self._planned_tokens(plan, seq)
        plan.chunks[:] = [c for c in plan.chunks if c.seq_id != seq.seq_id]
        plan.chunks.append(_chunk(seq, planned + n))
        self.guard.add(self._rank(seq), n, 0 if planned else 1, n if planned else seq.num_computed_tokens + n)
        if for_share:
            self.shares.took(seq.class_name, n)

    def _shed_over_limits(self, plan: StepPlan) -> None:
        """A policy swap may lower max_num_seqs or a class's max_running below what runs: the excess
        (least important, newest first) goes back to the head of its queue, so the limits hold now."""
        for state in self.classes.values():
            cap = state.policy.max_running
            while cap is not None and state.num_running > cap:
                mine = [s for s in self.running if s.class_name == state.name]
                self._preempt(max(mine, key=lambda s: (s.arrival_s, s.seq_id)), plan)
        while len(self.running) > self.max_num_seqs:
            self._preempt(victim_order(self.running, self._rank)[0], plan)

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
        self.shares.preempted(seq)
        for chunk in [c for c in plan.chunks if c.seq_id == seq.seq_id]:  # planned earlier this step
            plan.chunks.remove(chunk)
            self.shares.took(seq.class_name, -chunk.num_tokens)
            self.guard.add(state.rank, -chunk.num_tokens, -1, -(chunk.start + chunk.num_tokens))
        self._step.deferred.discard(seq.seq_id)
        item = seq.queue_item
        assert isinstance(item, QueuedItem)
        item.deadline_s = None  # the queue timeout bounds the wait before service, not a requeue
        state.queue.requeue_front(item)

    def _make_room(self, seq: Sequence, n: int, state: LLMClassState, plan: StepPlan) -> bool:
        """Room for an admission's first ``n`` tokens: a sequence slot and KV blocks, taken from strictly
        less important classes when short (even if planned this step: their chunk is dropped; a sequence
        that holds a background class's share keeps its slot, never KV blocks a more important class
        needs). The victims are chosen first and preempted only if together they make the room; else
        nobody is preempted and False (the request keeps its place).

        The KV asked for is the whole prompt (and the first output token), not just this chunk, so an
        admission does not stall half-way through its prompt and take blocks back by preemption; below
        the most important class it also leaves ADMISSION_HEADROOM of the pool free, the room the
        next voice request and the running decodes need without preempting anyone."""
        bm = self.block_manager
        need_slot = len(self.running) >= self.max_num_seqs - self._step.reserved_slots
        whole = max(n, seq.num_tokens + 1)  # a waiting sequence has no KV: all its tokens, the next one's
        headroom = 0
        if state.rank > self._top_rank:  # never more than the pool leaves beside the whole request, as the
            # block manager counts it (a copy's source too: counted on top, a prompt near the pool's size
            # asked one block more than the pool has, every step, and never started)
            headroom = min(int(ADMISSION_HEADROOM * bm.num_blocks), bm.num_blocks - bm.pool_cost(seq.seq_id, whole))
        short = blocks_short(bm, seq, whole, max(0, headroom))
        if not need_slot and short <= 0:
            return True
        order = [s for s in victim_order(self.running, self._rank) if self._rank(s) > state.rank]
        victims = plan_victims(bm, self.running, order, short, need_slot, keeps_slot=self.shares.protected)
        if victims is None:
            if short > 0 or len(self.running) >= self.max_num_seqs:  # not a slot left to a share
                self._note_blocked(state.rank)
            return False
        for victim in victims:
            self._preempt(victim, plan)
        if len(self.running) >= self.max_num_seqs or not bm.can_allocate(seq.seq_id, n):
            self.num_futile_preemptions += len(victims)  # a cached prefix shared with a victim: rare
            self._note_blocked(state.rank)
            return False
        return True

    def _note_blocked(self, rank: int) -> None:
        """A sequence of class rank ``rank`` was refused KV or a slot this step: no admission of a class
        as or less important may take what it waits for (it would only be preempted again)."""
        self._step.blocked_rank = min(self._step.blocked_rank, rank)

    # ---- results ---------------------------------------------------------------------------------
    def update(self, plan: StepPlan, output: StepOutput) -> list[Sequence]:
        with self.lock:
            self.block_manager.release_pins()  # the step ran: its KV copies are done
            now = self.clock.now()
            if self._in_flight is not None:
                start_s, num_tokens, rows, ctx = self._in_flight
                if self._trace is not None:
                    gap = start_s - self._last_step_end_s if self._last_step_end_s is not None else 0.0
                    self._trace.record(now, gap, self.step_cost.predict_s(num_tokens, rows, ctx), now - start_s,
                                       rows, num_tokens, ctx, plan,
                                       {c.seq_id: s.class_name for c in plan.chunks if (s := self.seqs.get(c.seq_id))})
                self.step_cost.observe(num_tokens, now - start_s, rows, ctx)
                self._in_flight = None
            self._last_step_end_s = now
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
                    if not seq.status.is_finished:
                        self._last_token_s[seq.seq_id] = now
            return touched

    def share_counters(self, counters: Mapping[str, Mapping[str, float]]) -> None:
        """Raise each class's VTC counters to a cluster's (class -> user -> service on every replica)."""
        for name, users in counters.items():
            state = self.classes.get(name)
            if state is not None:
                for user, value in users.items():
                    state.vtc.raise_to(user, value)

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
