"""Several LLMs on one device: which model's step runs next, by the same class rules as inside one.

Each model keeps its own step scheduler (its KV cache, class queues, fairness counters); steps stay per
model. The batcher sees them as one ``ModelSet``: its questions (is an interactive prompt waiting, what
ITL targets run, when does queued work become ready) are answered over every model, and when it chooses
an LLM step, ``choose`` says whose, by the claim of the work each model would serve (``StepScheduler
.claim``: the rank of its most important class with work now):

1. a model whose work is background only and whose ``min_share`` credit is owed steps first (a rate in
   device seconds per second while backlogged, as the batcher's background embedding shares: a model
   whose background classes are starved by other models' interactive work still progresses);
2. otherwise the best claim (most important class; among equals the model that stepped least recently);
   an interactive prompt waiting to be admitted goes at once (its user waits for the first token);
3. while the best model only decodes, the others fill the slack its running ITL targets leave after its
   last step (their step, measured, plus its own next step must fit), as background embedding batches
   do; a background model also within the margin of a class whose margin spans the time between its
   steps; and an interactive model whose own next token is late (its ITL target passed since its last
   step) gets its step anyway, so a chat stream on one model is never stalled by voice on another.

Each model's steps are sized by the other models' interactive targets too (``peer_targets``), and where
latency margins guard its steps, by their arrival bounds and the deadlines of their running classes'
next tokens (``peer_bounds``): a voice request or token on one model waits for whatever step of another
model runs when it is due.
"""

from __future__ import annotations

from homeai.policy.schema import Policy
from homeai.scheduling.interface import StepScheduler
from homeai.scheduling.share_bucket import ShareLedger
from homeai.scheduling.step_budget import ClassTargets
from homeai.scheduling.step_guard import PeerBounds

BACKGROUND_CLAIM = 1000  # ranks from here on are background classes (class_scheduler.BACKGROUND_RANK)
SHARE_BURST_S = 1.0  # a background model's share credit holds at most this long at its share's rate
ITL_SLACK_FRACTION = 0.95  # as the batcher: use at most this much of the tightest ITL target
_EWMA = 0.2  # weight of the newest step in a model's measured step length


class ModelSet:
    """The step schedulers of the device's LLMs, one per model, as one for the batcher (module docstring)."""

    def __init__(self, schedulers: dict[str, StepScheduler] | None = None) -> None:
        self.models: dict[str, StepScheduler] = {}
        self._last_end_s: dict[str, float] = {}
        self._step_s: dict[str, float] = {}  # measured step length per model (EWMA)
        self._shares = ShareLedger(SHARE_BURST_S)
        self._shares_at_s: float | None = None
        self._share_of: dict[str, float] = {}  # model -> min_share of its background LLM classes
        self._forced: str | None = None
        for name, sched in (schedulers or {}).items():
            self.add(name, sched)

    @classmethod
    def of(cls, scheduler: StepScheduler) -> ModelSet:
        """A set of one (tests, benches, ``run_alone``): the scheduler's model, or "llm"."""
        return cls({scheduler.model or "llm": scheduler})

    # ---- membership (the device thread: a model joins when loaded, leaves when unloaded) -----------
    def add(self, name: str, scheduler: StepScheduler) -> None:
        self.models[name] = scheduler
        scheduler.peer_targets = lambda: self._peer_targets(name)
        scheduler.peer_bounds = lambda: self._peer_bounds(name)

    def remove(self, name: str) -> StepScheduler | None:
        sched = self.models.pop(name, None)
        self._last_end_s.pop(name, None)
        self._shares.forget(name)
        if sched is not None:
            sched.peer_targets = None
            sched.peer_bounds = None
        return sched

    def _peer_targets(self, name: str) -> list[ClassTargets]:
        if len(self.models) < 2:
            return []
        return [t for other, sched in self.models.items() if other != name
                for t in sched.interactive_targets(sched.clock.now())]

    def _peer_bounds(self, name: str) -> PeerBounds:
        bounds = [sched.bounds_for_peers(sched.clock.now()) for other, sched in self.models.items() if other != name]
        return PeerBounds([m for b in bounds for m in b.margins], [d for b in bounds for d in b.deadlines])

    def apply_policy(self, policy: Policy) -> None:
        self._share_of = {}
        for cp in policy.classes.values():
            if cp.kind == "llm" and cp.background and cp.min_share > 0:
                self._share_of[cp.model] = self._share_of.get(cp.model, 0.0) + cp.min_share
        for sched in self.models.values():
            sched.apply_policy(policy)

    # ---- what the batcher asks, over every model ---------------------------------------------------
    def can_step(self, now: float) -> bool:
        return any(s.can_step(now) for s in self.models.values())

    def interactive_admission_ready(self, now: float) -> bool:
        return any(s.interactive_admission_ready(now) for s in self.models.values())

    def has_waiting_interactive(self) -> bool:
        return any(s.has_waiting_interactive() for s in self.models.values())

    def admission_hold_s(self, now: float) -> float:
        if len(self.models) == 1:
            return next(iter(self.models.values())).admission_hold_s(now)
        return min((s.admission_hold_s(now) for s in self.models.values() if s.has_waiting_interactive()),
                   default=float("inf"))

    def interactive_active(self, now: float) -> bool:
        return any(s.interactive_active(now) for s in self.models.values())

    def running_itl_targets_s(self) -> list[float]:
        return [t for s in self.models.values() for t in s.running_itl_targets_s()]

    def next_step_s(self) -> float | None:
        """The longest next step a model with running interactive work predicts (None: one has no
        prediction, or none runs: the batcher then assumes a full step budget)."""
        if len(self.models) == 1:
            return next(iter(self.models.values())).next_step_s()
        running = [s for s in self.models.values() if s.running_itl_targets_s()]
        predicted = [s.next_step_s() for s in running]
        if not predicted or any(p is None for p in predicted):
            return None
        return max(p for p in predicted if p is not None)

    def margin_intervals_s(self) -> list[float]:
        return [t for s in self.models.values() for t in s.margin_intervals_s()]

    def next_wake_s(self, after: float | None = None) -> float | None:
        times = [t for s in self.models.values() if (t := s.next_wake_s(after)) is not None]
        return min(times) if times else None

    # ---- the choice ---------------------------------------------------------------------------------
    def choose(self, now: float) -> str | None:
        """The model whose step runs now (see the module docstring); None: no model has work now."""
        claims = {name: c for name, s in self.models.items() if s.can_step(now) and (c := s.claim(now)) is not None}
        owed = self._refill(now, claims)
        if not claims:
            return None
        if owed:
            self._forced = min(owed, key=lambda m: self._last_end_s.get(m, float("-inf")))
            return self._forced
        order = sorted(claims, key=lambda m: (claims[m], self._last_end_s.get(m, float("-inf"))))
        top = order[0]
        best = self.models[top]
        if len(order) == 1 or claims[top] >= BACKGROUND_CLAIM or best.interactive_admission_ready(now) \
                or best.has_waiting_interactive():  # a prompt to admit or finish, a token a margin held back
            return top
        targets = best.running_itl_targets_s()
        if not targets:  # nothing of it is due by a target: interactive models take turns
            interactive = [m for m in order if claims[m] < BACKGROUND_CLAIM]
            return min(interactive, key=lambda m: self._last_end_s.get(m, float("-inf")))
        since = now - self._last_end_s.get(top, now)
        limit = ITL_SLACK_FRACTION * min(targets)
        margins = best.margin_intervals_s()
        for other in order[1:]:
            background = claims[other] >= BACKGROUND_CLAIM
            bound = min([limit, *margins]) if background else limit
            # a background model not measured yet may take anything: it waits for idle time to show it
            step_s = self._step_s.get(other, float("inf") if background else 0.0)
            if since + step_s + self._step_s.get(top, 0.0) <= bound:
                return other
            if not background and self._late(other, now, limit):
                return other
        return top

    def _late(self, name: str, now: float, fallback_s: float) -> bool:
        """The model's running interactive tokens are overdue: its tightest ITL target (else the best
        model's) has passed since its last step."""
        targets = self.models[name].running_itl_targets_s()
        last = self._last_end_s.get(name)
        return last is not None and now - last >= (min(targets) if targets else fallback_s)

    def _refill(self, now: float, claims: dict[str, int]) -> list[str]:
        """Refill the share credit of every model backlogged with background work only; the owed ones."""
        elapsed = 0.0 if self._shares_at_s is None else max(0.0, now - self._shares_at_s)
        self._shares_at_s = now
        if len(self.models) < 2:
            return []  # one model: its planner gives min_share inside each step
        owed = []
        for name in self.models:
            backlogged = claims.get(name, -1) >= BACKGROUND_CLAIM
            if self._shares.refill(name, self._share_of.get(name, 0.0), elapsed, 1.0, backlogged) and backlogged:
                owed.append(name)
        return owed

    def record(self, name: str, start_s: float, end_s: float) -> None:
        """Account a step of ``name``: its length (the next choices predict by it) and its share."""
        duration = max(0.0, end_s - start_s)
        prev = self._step_s.get(name)
        self._step_s[name] = duration if prev is None else (1 - _EWMA) * prev + _EWMA * duration
        self._last_end_s[name] = end_s
        forced = self._forced == name
        if forced or self._shares.credit(name) > 0:  # idle-capacity service only uses up credit, never debt
            self._shares.charge(name, duration, forced=forced)
        self._forced = None
