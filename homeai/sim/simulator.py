"""Runs the real class schedulers and batcher on virtual time with a cost-model runner.

Nothing here is a re-implementation of the policy: the same ``ClassScheduler``, ``ModelSet`` and
``Batcher`` objects the server uses plan every step; only the device is replaced by a cost model that
advances a ``VirtualClock``. Each LLM the policy names gets its own class scheduler and KV pool, as on the
server, and its own cost model (``costs``; else ``cost``). Runs are deterministic, so policies can be
compared at scales this machine cannot run.

A ``Simulator`` is one device. ``run`` drives it through a whole trace; a cluster simulation
(``sim.cluster_sim``) instead posts the requests its router placed here (``post``), moves the device one
iteration at a time (``step``) beside the others, and hears of first tokens and ends (``on_first_token``,
``on_end``).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams, StepOutput
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import Batcher, EmbedWork
from homeai.scheduling.class_queue import QueuedItem, QueueFullError
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.device import run_once
from homeai.scheduling.model_set import ModelSet
from homeai.scheduling.step_budget import StepCostModel
from homeai.sim.cost_model import CostModel
from homeai.sim.trace import TraceRequest

FAKE_TOKEN = 7
# (class, priority level, user) a trace request is sent as under a given policy
Mapping = Callable[[TraceRequest], tuple[str, int | None, str]]


@dataclass(slots=True)
class RequestRecord:
    req: TraceRequest
    rid: str = ""
    first_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    done_s: float | None = None
    inputs_left: int = 0
    rejected: str | None = None


@dataclass(slots=True)
class SimResult:
    records: list[RequestRecord]
    horizon_s: float
    processed_tokens: dict[str, int]  # class -> tokens the device processed (prefill + decode + embed)
    num_llm_steps: int = 0
    num_embed_batches: int = 0
    num_preemptions: int = 0
    busy_s: dict[str, float] = field(default_factory=dict)  # class -> device seconds (steps split by tokens)
    in_flight: set[str] = field(default_factory=set)  # request ids still queued or running at the horizon
    num_futile_preemptions: int = 0  # preemptions that did not make the room they were made for
    wasted_tokens: dict[str, int] = field(default_factory=dict)  # class -> computed, then thrown away
    # Where the device's time went, by what each piece of work carried: "llm:voice+chat" (an LLM step
    # with those interactive classes' rows, background rows beside them or not), "llm:background" (none),
    # "embed:<class>" (its inputs' share of batches, by tokens), "embed_fixed:<class>" (of that, the
    # batches' fixed cost)
    device_s: dict[str, float] = field(default_factory=dict)

    def useful_tokens(self, class_name: str) -> int:
        """Tokens of a class the device processed that survive: preempted work computed again is waste."""
        return self.processed_tokens.get(class_name, 0) - self.wasted_tokens.get(class_name, 0)

    @property
    def lost(self) -> list[RequestRecord]:
        """Requests that neither ended (finished, rejected, timed out) nor are still queued or running:
        they vanished, and their clients would wait forever."""
        return [r for r in self.records if r.done_s is None and r.rejected is None and r.rid not in self.in_flight]


class Simulator:
    def __init__(self, policy: Policy, cost: CostModel, mapping: Mapping, num_kv_blocks: int = 4096,
                 block_size: int = 16, background_concurrency: int = 16,
                 costs: dict[str, CostModel] | None = None) -> None:
        self.clock = VirtualClock()
        self.cost = cost
        self.mapping = mapping
        self.policy = policy
        models = list(dict.fromkeys(c.model for c in policy.classes.values() if c.kind == "llm")) or ["llm"]
        self.costs = {m: (costs or {}).get(m, cost) for m in models}
        self.schedulers: dict[str, ClassScheduler] = {}
        for model in models:
            c = self.costs[model]
            # The planner's step-cost model starts from the profile, as `homeai bench calibrate` seeds a server.
            seed = StepCostModel(c.base_s, c.per_token_s + c.per_seq_s, prompt_token_s=c.per_token_s,
                                 per_ctx_s=c.per_ctx_token_s)
            self.schedulers[model] = ClassScheduler(BlockManager(num_kv_blocks, block_size), policy, self.clock,
                                                    model=model if len(models) > 1 else None, step_cost=seed)
        self._cost_of = {id(self.schedulers[m]): self.costs[m] for m in models}
        self.scheduler = next(iter(self.schedulers.values()))  # the only one, where there is one
        self.block_manager = self.scheduler.block_manager
        self.batcher = Batcher(policy, ModelSet(dict(self.schedulers)), self.clock,
                               embed_cost=StepCostModel(cost.embed_base_s, cost.embed_per_token_s))
        self._ids = itertools.count()
        self.records: dict[str, RequestRecord] = {}
        self.processed: dict[str, int] = {}
        self.wasted: dict[str, int] = {}  # class -> tokens computed, then thrown away by a preemption
        self._computed: dict[int, int] = {}  # seq id -> tokens computed for it since it was last admitted
        self.busy_s: dict[str, float] = {}
        self.device_s: dict[str, float] = {}
        # Background jobs are closed-loop clients (as the job runner is): at most this many requests of
        # each background class outstanding; the next goes in when one completes.
        self.background_concurrency = background_concurrency
        self._backlog: dict[str, list[TraceRequest]] = {}
        self._outstanding: dict[str, int] = {}
        self._pending: list[TraceRequest] = []  # interactive arrivals in time order; _next is due next
        self._next = 0
        self._steps = self._batches = 0
        # What a cluster's front door hears of a request here, at the device's time: its first token
        # (an embedding's answer counts as one) and its end (finished, rejected or timed out).
        self.on_first_token: Callable[[RequestRecord, float], None] | None = None
        self.on_end: Callable[[RequestRecord, float], None] | None = None

    def post(self, req: TraceRequest) -> None:
        """A request placed here from outside (a cluster's router), at or before the device's time: it
        enters its queue at the next iteration, stamped with its arrival. Posts come in arrival order."""
        self._pending.append(req)

    def _submit(self, req: TraceRequest) -> None:
        rid = f"r{next(self._ids)}"
        rec = self.records[rid] = RequestRecord(req, rid)
        cls, level, user = self.mapping(req)
        try:
            if req.kind == "llm":
                sched = self._scheduler_of(cls)
                bm = sched.block_manager
                if bm.blocks_needed(req.prompt_tokens + req.max_tokens) > bm.num_blocks:
                    rec.rejected = "exceeds_kv_cache"  # the engine refuses it before it is queued (400)
                    self._done(rec)
                    return
                params = SamplingParams(temperature=0.0, max_tokens=req.max_tokens, ignore_eos=True)
                seq = Sequence(next(self._ids), rid, [FAKE_TOKEN] * req.prompt_tokens, params,
                               class_name=cls, user=user, priority_level=level)
                sched.add(seq, req.arrival_s)
            else:
                assert req.input_tokens is not None
                rec.inputs_left = len(req.input_tokens)
                for k, n in enumerate(req.input_tokens):
                    self.batcher.push_embedding(cls, QueuedItem(f"{rid}/{k}", user, priority_level=level,
                                                                cost=n, payload=(rid, n, req.class_name)),
                                                req.arrival_s)
        except QueueFullError:
            rec.rejected = "queue_full"
            self._done(rec)

    def _scheduler_of(self, class_name: str) -> ClassScheduler:
        cp = self.policy.classes.get(class_name)
        return self.schedulers.get(cp.model, self.scheduler) if cp is not None else self.scheduler

    def _refill_background(self, now: float) -> None:
        for cls, backlog in self._backlog.items():
            while backlog and backlog[-1].arrival_s <= now \
                    and self._outstanding.get(cls, 0) < self.background_concurrency:
                req = backlog.pop()
                req.arrival_s = max(req.arrival_s, now)
                self._outstanding[cls] = self._outstanding.get(cls, 0) + 1
                self._submit(req)

    def _first(self, rec: RequestRecord, now: float) -> None:
        rec.first_s = now
        if self.on_first_token is not None:
            self.on_first_token(rec, now)

    def _done(self, rec: RequestRecord) -> None:
        if rec.req.background and rec.req.class_name in self._outstanding:  # our own closed loop's
            self._outstanding[rec.req.class_name] -= 1
        if self.on_end is not None:
            self.on_end(rec, self.clock.now())

    def run(self, trace: list[TraceRequest], horizon_s: float) -> SimResult:
        for req in trace:
            if req.background:
                self._backlog.setdefault(req.class_name, []).append(copy.copy(req))
        for backlog in self._backlog.values():
            backlog.reverse()  # pop() takes them in trace order
        self._pending = sorted((r for r in trace if not r.background), key=lambda r: r.arrival_s)
        self._next = 0
        self._steps = self._batches = 0
        while self.clock.now() < horizon_s:
            self.step(horizon_s)
        return self.result(horizon_s)

    def step(self, until_s: float) -> None:
        """One iteration of the device loop on virtual time; when nothing was ready, the device sleeps
        to the next arrival or deadline strictly after now, or to ``until_s`` if that comes first
        (never past work that is ready now: run_once would have run it)."""
        if run_once(self.batcher, self):
            return
        now = self.clock.now()
        arrival = self._pending[self._next].arrival_s if self._next < len(self._pending) else None
        later = [b[-1].arrival_s for b in self._backlog.values() if b]  # a background job that starts later
        wake = [t for t in (arrival, self.batcher.next_wake_s(after=now), *later) if t is not None and t > now]
        self.clock.set(max(now, min([*wake, until_s])))

    @property
    def num_unsubmitted(self) -> int:
        """Posted requests the device has not taken into its queues yet (still in its inbox)."""
        return len(self._pending) - self._next

    def result(self, horizon_s: float) -> SimResult:
        """The figures so far; requests still queued or running are ``in_flight``."""
        scheds = self.schedulers.values()
        in_flight = {seq.request_id for sched in scheds for seq in sched.seqs.values()}
        in_flight |= {item.payload[0] for q in self.batcher.embed_queues.values() for item in q}
        wasted = {name: n for name, n in self.wasted.items() if n}
        return SimResult(list(self.records.values()), horizon_s, dict(self.processed), self._steps,
                         self._batches, sum(s.num_preemptions for s in scheds), dict(self.busy_s), in_flight,
                         sum(s.num_futile_preemptions for s in scheds), wasted, dict(self.device_s))

    # ---- the Device protocol (homeai.scheduling.device): a cost model instead of an accelerator ----
    def apply_inbox(self) -> None:
        """Requests that have arrived by now enter their queues, as posted requests do on the server."""
        now = self.clock.now()
        while self._next < len(self._pending) and self._pending[self._next].arrival_s <= now:
            self._submit(self._pending[self._next])
            self._next += 1
        self._refill_background(now)

    def fail_expired(self) -> None:
        self._collect_timeouts()

    def llm_step(self, model: str | None = None) -> bool:
        ran = self._llm_step(self.schedulers.get(model, self.scheduler) if model is not None else self.scheduler)
        self._steps += ran
        return ran

    def embed_batch(self, work: EmbedWork) -> None:
        self._embed_batch(work)
        self._batches += 1

    def _llm_step(self, sched: ClassScheduler) -> bool:
        plan = sched.schedule()
        seqs = sched.seqs
        for sid in plan.preempted:  # what it computed is recomputed when it runs again
            trace_cls = self.records[seqs[sid].request_id].req.class_name
            self.wasted[trace_cls] = self.wasted.get(trace_cls, 0) + self._computed.pop(sid, 0)
        if plan.is_empty:
            return False
        ctx = sum(c.start + c.num_tokens for c in plan.chunks)
        step_s = self._cost_of[id(sched)].llm_step_s(plan.num_tokens, len(plan.chunks), ctx)
        self.clock.advance(step_s)
        reqs = [self.records[seqs[c.seq_id].request_id].req for c in plan.chunks]
        kind = "llm:" + ("+".join(sorted({r.class_name for r in reqs if not r.background})) or "background")
        self.device_s[kind] = self.device_s.get(kind, 0.0) + step_s
        for c in plan.chunks:
            trace_cls = self.records[seqs[c.seq_id].request_id].req.class_name
            self.processed[trace_cls] = self.processed.get(trace_cls, 0) + c.num_tokens
            self._computed[c.seq_id] = self._computed.get(c.seq_id, 0) + c.num_tokens
            self.busy_s[trace_cls] = self.busy_s.get(trace_cls, 0.0) + step_s * c.num_tokens / plan.num_tokens
        output = StepOutput(sampled={c.seq_id: FAKE_TOKEN for c in plan.chunks if c.sample})
        now = self.clock.now()
        for seq in sched.update(plan, output):
            rec = self.records[seq.request_id]
            rec.token_times.append(now)
            if rec.first_s is None:
                self._first(rec, now)
            if seq.status.is_finished:
                self._computed.pop(seq.seq_id, None)
                rec.done_s = now
                self._done(rec)
        return True

    def _embed_batch(self, work: EmbedWork) -> None:
        tokens = sum(item.payload[1] for item in work.items)
        batch_s = self.cost.embed_batch_s(tokens)
        self.clock.advance(batch_s)
        fixed_s = min(batch_s, self.cost.embed_base_s)
        now = self.clock.now()
        for item in work.items:
            rid, n, trace_cls = item.payload
            for key, seconds in ((f"embed:{trace_cls}", batch_s), (f"embed_fixed:{trace_cls}", fixed_s)):
                self.device_s[key] = self.device_s.get(key, 0.0) + seconds * n / max(1, tokens)
            self.processed[trace_cls] = self.processed.get(trace_cls, 0) + n
            self.busy_s[trace_cls] = self.busy_s.get(trace_cls, 0.0) + batch_s * n / max(1, tokens)
            rec = self.records[rid]
            rec.inputs_left -= 1
            if rec.inputs_left == 0:
                rec.done_s = now
                self._first(rec, now)
                self._done(rec)

    def _collect_timeouts(self) -> None:
        for seq in (s for sched in self.schedulers.values() for s in sched.drain_rejected()):
            self.records[seq.request_id].rejected = "queue_full" if seq.refusal is not None else "timeout"
            self._done(self.records[seq.request_id])
        gone = [(item, "timeout") for _, item in self.batcher.expire_embeddings()]
        gone += [(item, "queue_full") for _, item, _refusal in self.batcher.pushed_out_embeddings()]
        gone += [(item, "retired") for _, item, _why in self.batcher.retired_embeddings()]
        for item, why in gone:
            rec = self.records[item.payload[0]]
            if rec.rejected is None:
                rec.rejected = why
                self._done(rec)
