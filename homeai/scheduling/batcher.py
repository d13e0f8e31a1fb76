"""One batcher for the device: each iteration, an LLM step or a batch of one embedding class.

Order of preference:
1. an interactive embedding class whose Triton batch is ready runs between LLM steps at once
   (alternating with LLM steps so neither starves the other);
2. a background class owed its ``min_share`` runs a batch even if its delay window has not closed, so
   it is never starved. The share is a rate (``share_bucket``): credit refills at min_share device
   seconds per second while the class is backlogged and is capped, so a class that starts late (or
   at a cold start) is owed nothing yet and never repays a "debt" in back-to-back batches; a forced
   batch is cut to the running interactive sequences' ITL slack;
3. LLM work that is new to admit (a prefill whose delay window is open) runs first: TTFT matters;
4. a background embedding batch runs while the running interactive sequences have slack against
   their inter-token-latency targets (time since the last LLM step + the batch's expected cost + the
   next step stays under the tightest ITL target): background work fills idle capacity, including the
   gaps between decode steps, without making anyone's tokens late. Where the running classes set latency
   margins the planner predicts the next step (its lower-class work is bounded), else it is assumed to
   last ITL_STEP_FRACTION of the target; a class whose margin spans the time between its steps
   (``margin_between_steps``, voice) keeps its tokens within (1 + margin) of its own step, gaps
   included; waiting interactive work goes first, except a request of a class that already decodes,
   which may wait behind a batch within its arrival bound (``admission_hold_s``);
5. otherwise the LLM step.

With several LLMs on the device (``ModelSet``), "the LLM step" is the step of the model ``ModelSet.choose``
names (``step_model``): the questions above are answered over every model, and the models' claims (the
same class ranks, targets and shares) decide whose step it is.

Every embedding batch, interactive or background, is cut to what the interactive LLM classes' latency
targets bear, as the planner cuts LLM steps (``step_budget``): its duration, predicted by a cost model of
the embedding model fitted online (``seconds = base_s + per_token_s * tokens``), stays within the rest
of the tightest running ITL target after an LLM step while an interactive class decodes, and within a
fraction of the tightest TTFT target otherwise (a voice request may arrive during it, after a quiet
spell too). A flood of long inputs thus takes turns with voice's tokens in short batches instead of
second-long ones. While the house is active a background batch lasts at most what a voice request
arriving during it could bear: the LLM classes' arrival bound where they set latency margins (as
background-only LLM steps), else BACKGROUND_BATCH_TTFT_FRACTION of the tightest TTFT target.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from homeai.policy.schema import Policy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem, QueueFullError
from homeai.scheduling.class_scheduler import UnknownClassError
from homeai.scheduling.clock import Clock, MonotonicClock
from homeai.scheduling.fairness import VirtualTokenCounter
from homeai.scheduling.interface import StepScheduler
from homeai.scheduling.model_set import ModelSet
from homeai.scheduling.share_bucket import ShareLedger
from homeai.scheduling.step_budget import (
    INTERACTIVE_HORIZON_S,
    ITL_STEP_FRACTION,
    QUIET_TTFT_STEP_FRACTION,
    TTFT_STEP_FRACTION,
    StepCostModel,
)

SHARE_WINDOW_S = 5.0
BACKGROUND_BATCH_TTFT_FRACTION = 0.05  # a background batch may cost this much of the tightest TTFT target
ITL_SLACK_FRACTION = 0.95  # use at most this much of the tightest ITL target for background batches
SHARE_BURST_S = 1.0  # a background class's share credit holds at most this long at its share's rate
# A small sentence encoder on a CPU (the simulator's cpu-135m figures) until measured batches refit it.
DEFAULT_EMBED_COST = (0.004, 0.00015)  # (base_s, per_token_s)
# An embedding request is queued when its first input finds room under max_queue_size, and brings all of
# its inputs (an OpenAI request may carry 2,048; counted one by one, a request with more inputs than the
# queue holds got a 429 that no retry could ever pass).
FOLLOWER_ALLOWANCE = 2**31


@dataclass(slots=True)
class EmbedWork:
    class_name: str
    items: list[QueuedItem]


LLM_STEP = "llm"


class Batcher:
    """Chooses the device's next piece of work (see the module docstring)."""

    def __init__(self, policy: Policy, llm: StepScheduler | ModelSet | None, clock: Clock | None = None,
                 embed_cost: StepCostModel | None = None) -> None:
        # One scheduler (a test, a bench, ``run_alone``) is a set of one model.
        self.llm: ModelSet | None = ModelSet.of(llm) if isinstance(llm, StepScheduler) else llm
        self.step_model: str | None = None  # whose step the last LLM_STEP handed out is
        # Per embedding model: a batch's duration by its tokens, seeded (a calibration, a profile) and
        # fitted on every batch the device runs.
        self._embed_seed = embed_cost or StepCostModel(*DEFAULT_EMBED_COST)
        self._embed_cost: dict[str, StepCostModel] = {}
        self._taken_tokens: dict[str, int] = {}  # class -> tokens of the batch last handed out
        self.clock = clock or MonotonicClock()
        self.lock = threading.RLock()  # as the scheduler's: the device thread owns the batcher
        self.embed_queues: dict[str, ClassQueue] = {}
        self._busy: deque[tuple[float, float, str]] = deque()  # (start, duration, class or "llm")
        self._cost_s: dict[str, float] = {}  # EWMA of a batch's duration per class
        self._last_llm_end_s = 0.0
        self._last_was_embed = False
        self._per_item_s: dict[str, float] = {}  # EWMA of a batch's duration per input, per class
        self._last_interactive_embed_s = float("-inf")
        self._expired: list[tuple[str, QueuedItem]] = []  # timed out while pushing, not yet reported
        self._pushed_out: list[tuple[str, QueuedItem, QueueFullError]] = []  # for another user's, not yet reported
        self._retired: list[tuple[str, QueuedItem, str]] = []  # queued when a swap retired their class, and why
        self._shares = ShareLedger(SHARE_BURST_S)  # min_share credit of background classes, in seconds
        self._shares_at_s: float | None = None  # when the credits were last refilled
        self._forced: str | None = None  # the class whose batch is out on its share
        self.apply_policy(policy)

    def apply_policy(self, policy: Policy) -> None:
        """Follow a policy swap. An embedding class it removes (or makes an LLM class) leaves with its queue,
        and one it moves to another encoder keeps its queue but not what is queued (tokenized for the old
        one): those inputs fail with the reason (``retired_embeddings``), as a retired LLM class's
        unstarted requests do, instead of failing as batches of a class the policy no longer has."""
        with self.lock:
            self.policy = policy
            for name, old in list(self.embed_queues.items()):
                cp = policy.classes.get(name)
                if cp is None or cp.kind != "embedding":
                    why = "was removed by a policy change" if cp is None else "is now an LLM class"
                    self._retire(name, old, f"class {name!r} {why}")
                    del self.embed_queues[name]
                elif cp.model != old.policy.model:
                    self._retire(name, old, f"class {name!r} now runs on model {cp.model!r}, not {old.policy.model!r}")
            for name, cp in policy.classes.items():
                if cp.kind != "embedding":
                    continue
                queue = self.embed_queues.get(name)
                if queue is not None:
                    queue.set_policy(cp)
                    if queue.fairness is not None:
                        queue.fairness.apply_policy(policy, name)
                else:  # per-user fairness inside an embedding class too: one user's flood must not queue others
                    self.embed_queues[name] = ClassQueue(name, cp, VirtualTokenCounter.from_policy(policy, name))
        if self.llm is not None:
            self.llm.apply_policy(policy)

    def _retire(self, name: str, queue: ClassQueue, reason: str) -> None:
        self._retired += [(name, item, reason) for item in _take_all(queue)]

    def take_all_embeddings(self) -> list[QueuedItem]:
        """Every queued input of every class, out of its queue (the loop's last resort fails them)."""
        with self.lock:
            return [item for queue in self.embed_queues.values() for item in _take_all(queue)]

    def retired_embeddings(self) -> list[tuple[str, QueuedItem, str]]:
        """Inputs a policy swap took out of their queue, each once, with the reason (the caller fails them)."""
        with self.lock:
            out, self._retired = self._retired, []
            return out

    def push_embedding(self, class_name: str, item: QueuedItem, now: float | None = None,
                       follows: bool = False) -> None:
        """Queue one embedding input; raises QueueFullError at once when the class queue is full.
        ``follows``: a later input of a request whose first one was queued, admitted past the limit."""
        with self.lock:
            queue = self.embed_queues.get(class_name)
            if queue is None:  # a request routed just before a swap took its class away: a 400 naming it
                raise UnknownClassError(f"{class_name!r} is not an embedding class; known: {sorted(self.embed_queues)}")
            now = self.clock.now() if now is None else now
            # Timed-out inputs make room first; they are answered by the next expire_embeddings().
            self._expired += [(class_name, it) for it in queue.expire(now)]
            queue.push(item, now, num_free_slots=FOLLOWER_ALLOWANCE if follows else 0)
            self._pushed_out += [(class_name, it, refusal) for it, refusal in queue.take_pushed_out()]
            if not queue.policy.background:
                self._last_interactive_embed_s = now

    def cancel_embedding(self, class_name: str, request_id: str) -> None:
        with self.lock:
            queue = self.embed_queues.get(class_name)
            if queue is not None:
                queue.cancel(request_id)

    def pushed_out_embeddings(self) -> list[tuple[str, QueuedItem, QueueFullError]]:
        """Inputs a full queue pushed out for another user's, each once, with the 429 (the caller fails them)."""
        with self.lock:
            out, self._pushed_out = self._pushed_out, []
            return out

    def expire_embeddings(self) -> list[tuple[str, QueuedItem]]:
        """Apply timeouts; every REJECTed input comes out here exactly once (the caller fails it)."""
        now = self.clock.now()
        with self.lock:
            out, self._expired = self._expired, []
            return out + [(name, item) for name, q in self.embed_queues.items() for item in q.expire(now)]

    # ---- the decision ----------------------------------------------------------------------------
    def take_next(self) -> str | EmbedWork | None:
        """Choose the device's next piece of work and take it: an embedding batch leaves its queue
        (hence a verb, not a query); ``LLM_STEP`` means the scheduler plans the step; None: nothing ready."""
        now = self.clock.now()
        with self.lock:
            # Only an LLM step that would do something counts: a queued request behind a closed delay
            # window must neither hold back a ready embedding batch nor yield an empty step (the loop would spin).
            llm_has_work = self.llm is not None and self.llm.can_step(now)
            interactive, background = self._ready_embedding(now)
            if interactive and not (self._last_was_embed and llm_has_work):
                return self._take(interactive[0], now)
            for cp_name in self._starved_background(now):
                work = self._take(cp_name, now, force=True)
                if work is not None:
                    self._forced = cp_name
                    return work
            if llm_has_work and self.llm is not None and self.llm.interactive_admission_ready(now) \
                    and not (background and self._has_slack(background[0], now)):
                return self._llm_step(now)
            if background and self._has_slack(background[0], now):
                # With only background LLM work (nothing interactive runs), take turns with it.
                if not (self._last_was_embed and llm_has_work and not self._running_itl_targets_s()):
                    return self._take(background[0], now)
            if llm_has_work:
                return self._llm_step(now)
            return self._take(background[0], now) if background else None

    def _llm_step(self, now: float) -> str | None:
        """``LLM_STEP``, with ``step_model`` naming whose step it is by the models' claims."""
        assert self.llm is not None
        self.step_model = self.llm.choose(now)
        return LLM_STEP if self.step_model is not None else None

    def _ready_embedding(self, now: float) -> tuple[list[str], list[str]]:
        interactive: list[str] = []
        background: list[str] = []
        max_s = self._batch_limit_s(now)
        for name, q in sorted(self.embed_queues.items(), key=lambda kv: kv[1].policy.priority):
            ready = q.next_ready_at(now, max_cost=self._max_tokens(q, max_s))
            if ready is not None and ready <= now:
                (background if q.policy.background else interactive).append(name)
        return interactive, background

    def _take(self, name: str, now: float, force: bool = False) -> EmbedWork | None:
        q = self.embed_queues[name]
        cap = self._background_cap(q, now)
        if force:
            cap = min(cap or q.policy.max_batch_size, self._slack_items(q, now))
        max_cost = self._max_tokens(q, self._batch_limit_s(now))
        items = q.form_batch(now, cap, force=force or cap is not None, max_cost=max_cost)
        if not items:
            return None
        self._last_was_embed = True
        self._taken_tokens[name] = sum(item.cost for item in items)
        return EmbedWork(name, items)

    def _batch_limit_s(self, now: float) -> float | None:
        """How long an embedding batch may last now, as LLM steps are sized: while an interactive class
        decodes, what its tightest ITL target leaves after an LLM step (1 - ITL_STEP_FRACTION of it);
        within TTFT_STEP_FRACTION of the tightest interactive TTFT target while interactive work is
        active, QUIET_TTFT_STEP_FRACTION when it is not (its next request may come at any moment).
        None: no interactive LLM class has targets."""
        if self.llm is None:
            return None
        limits = [(1.0 - ITL_STEP_FRACTION) * t for t in self._running_itl_targets_s()]
        ttft = [cp.targets.ttft_ms / 1000.0 for cp in self.policy.classes.values()
                if cp.kind == "llm" and not cp.background and cp.targets.ttft_ms]
        if ttft:
            fraction = TTFT_STEP_FRACTION if self.llm.interactive_active(now) else QUIET_TTFT_STEP_FRACTION
            limits.append(fraction * min(ttft))
        return min(limits) if limits else None

    def _max_tokens(self, q: ClassQueue, limit_s: float | None) -> int | None:
        """The tokens a batch of ``q`` may hold to last at most ``limit_s`` on its model's fitted cost."""
        if limit_s is None:
            return None
        return self._cost_model(q.policy.model).tokens_within(limit_s)

    def _cost_model(self, model: str) -> StepCostModel:
        cost = self._embed_cost.get(model)
        if cost is None:
            seed = self._embed_seed
            cost = self._embed_cost[model] = StepCostModel(seed.base_s, seed.per_token_s)
        return cost

    def _background_cap(self, q: ClassQueue, now: float) -> int | None:
        """While interactive classes are active, a background batch is cut to what costs at most
        BACKGROUND_BATCH_TTFT_FRACTION of the tightest TTFT target (measured cost per input), so a voice
        request that arrives during it waits little; its first batch, cost unknown, is one input (a full
        one can take seconds on a CPU). A quiet house gets full batches."""
        if not q.policy.background:
            return None
        recent_llm = self.llm is not None and self.llm.interactive_active(now)
        if not recent_llm and now - self._last_interactive_embed_s > INTERACTIVE_HORIZON_S:
            return None
        targets = [cp.targets.ttft_ms / 1000.0 for cp in self.policy.classes.values()
                   if not cp.background and cp.targets is not None and cp.targets.ttft_ms]
        if not targets:
            return None
        if q.name not in self._per_item_s:
            return 1
        arrival = self._arrival_bound_s()
        budget_s = arrival if arrival is not None else BACKGROUND_BATCH_TTFT_FRACTION * min(targets)
        per_item_s = max(self._per_item_s[q.name], 1e-9)  # a batch of inputs nobody awaited costs 0
        return max(1, min(q.policy.max_batch_size, int(budget_s / per_item_s)))

    def _arrival_bound_s(self) -> float | None:
        """The longest a background batch may last while the house is active where the interactive LLM
        classes set latency margins: what their requests arriving during it could bear (their
        ``arrival_step_fraction`` of the TTFT target), as background-only LLM steps are bounded."""
        bounds = [cp.arrival_fraction * cp.targets.ttft_ms / 1000.0 for cp in self.policy.classes.values()
                  if cp.kind == "llm" and cp.arrival_fraction is not None and cp.targets.ttft_ms]
        return min(bounds) if bounds else None

    def _interval_limit_s(self, itl_targets: list[float]) -> float:
        """The longest the time from the last LLM step's end to the next one's may be: within the running
        interactive classes' ITL targets, and within the latency margins of those whose margin also
        spans the time between their steps (``margin_between_steps``)."""
        limit = ITL_SLACK_FRACTION * min(itl_targets)
        if self.llm is not None:
            limit = min([limit, *self.llm.margin_intervals_s()])
        return limit

    def _starved_background(self, now: float) -> list[str]:
        """Background classes whose share credit covers their next batch (see the module docstring)."""
        elapsed = 0.0 if self._shares_at_s is None else max(0.0, now - self._shares_at_s)
        self._shares_at_s = now
        out = []
        for name, q in self.embed_queues.items():
            share = q.policy.min_share if q.policy.background else 0.0
            # a batch may overdraw: the credit then refills from below 0
            if self._shares.refill(name, share, elapsed, 1.0, backlogged=len(q) > 0) and len(q):
                out.append(name)
        return out

    def _slack_items(self, q: ClassQueue, now: float) -> int:
        """Inputs of a forced background batch that fit before the running interactive sequences' next
        token is due (at least one: the share must buy progress)."""
        itl_targets = self._running_itl_targets_s()
        per_item = self._per_item_s.get(q.name)
        if not itl_targets or not per_item:
            return q.policy.max_batch_size
        slack_s = self._interval_limit_s(itl_targets) - (now - self._last_llm_end_s) \
            - self._next_llm_step_s(itl_targets)
        return max(1, min(q.policy.max_batch_size, int(slack_s / per_item)))

    def _has_slack(self, name: str, now: float) -> bool:
        """True when no interactive sequence runs, or a batch fits in the tightest ITL target's slack.
        Never while interactive LLM requests wait in a queue: then the LLM runs at full speed to drain
        them, and background work gets only its min_share."""
        if self.llm is not None and self.llm.has_waiting_interactive() \
                and self._cost_s.get(name, float("inf")) > self.llm.admission_hold_s(now):
            return False
        itl_targets = self._running_itl_targets_s()
        if not itl_targets:
            return True
        cost = self._cost_s.get(name, 0.0) + self._next_llm_step_s(itl_targets)  # the next token needs a step
        return (now - self._last_llm_end_s) + cost <= self._interval_limit_s(itl_targets)

    def _next_llm_step_s(self, itl_targets: list[float]) -> float:
        """What the next LLM step may cost: where the running interactive classes set latency margins,
        what the planner predicts (the margins bound what lower-class work adds, a prompt chunk
        included); otherwise the planner sizes steps up to ITL_STEP_FRACTION of the tightest ITL target,
        and a step with a new prompt chunk is that long, not the average."""
        predicted = self.llm.next_step_s() if self.llm is not None else None
        if predicted is not None:
            return predicted
        return max(self._cost_s.get(LLM_STEP, 0.0), ITL_STEP_FRACTION * min(itl_targets))

    def _running_itl_targets_s(self) -> list[float]:
        return self.llm.running_itl_targets_s() if self.llm is not None else []

    # ---- bookkeeping -----------------------------------------------------------------------------
    def llm_turn_passed(self) -> None:
        """The LLM step chosen ran nothing (its plan was empty): its turn counts as taken, so an interactive
        embedding batch is not held back behind it."""
        with self.lock:
            self._last_was_embed = False

    def record(self, what: str, start_s: float, end_s: float, num_items: int = 0) -> None:
        """Account a finished piece of work: its class (or "llm") and how long the device was busy."""
        with self.lock:
            duration = max(0.0, end_s - start_s)
            self._busy.append((start_s, duration, what))
            while self._busy and self._busy[0][0] < end_s - SHARE_WINDOW_S:
                self._busy.popleft()
            prev = self._cost_s.get(what)
            self._cost_s[what] = duration if prev is None else 0.8 * prev + 0.2 * duration
            # every batch counts against the share, forced or on idle capacity
            self._shares.charge(what, duration, forced=self._forced == what)
            self._forced = None
            if what == LLM_STEP:
                self._last_llm_end_s = end_s
                self._last_was_embed = False
                if self.llm is not None and self.step_model is not None:
                    self.llm.record(self.step_model, start_s, end_s)
            else:
                tokens = self._taken_tokens.pop(what, 0)
                if num_items and duration > 0:  # a batch whose callers all left ran nothing
                    per = duration / num_items
                    prev = self._per_item_s.get(what)
                    self._per_item_s[what] = per if prev is None else 0.8 * prev + 0.2 * per
                    q = self.embed_queues.get(what)
                    if q is not None and tokens:
                        self._cost_model(q.policy.model).observe(tokens, duration)

    def next_wake_s(self, after: float | None = None) -> float | None:
        """The earliest time something may become ready (a delay window closing, a timeout); with
        ``after``, only later times: an idle loop sleeps until then, never spins on what is ready now
        but cannot run. A query: it changes nothing."""
        now = self.clock.now()
        with self.lock:
            times = [t for q in self.embed_queues.values() for t in (q.next_ready_at(now), q.next_expiry_at())
                     if t is not None and (after is None or t > after)]
            if self.llm is not None and (t := self.llm.next_wake_s(after)) is not None:
                times.append(t)
        return min(times) if times else None


def _take_all(queue: ClassQueue) -> list[QueuedItem]:
    items = list(queue)
    for item in items:
        queue.cancel(item.request_id)
    return items
