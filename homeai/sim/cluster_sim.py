"""Several devices on one virtual timeline, behind the cluster's own ``Router``.

Each device is a ``Simulator`` (the real class schedulers, batcher and a cost model) with its own clock;
the devices run side by side, the one furthest behind in time going next, so that no event is handled
before every device has reached its time. Events are arrivals (the router places each request on a
device), the devices' published loads (every ``publish_interval_s``, as replicas publish on a real
cluster: the router works with loads that old plus its own count of what it sent), the first tokens and
ends the devices report (the router's bookkeeping, and the background jobs' closed loop), and devices
leaving and returning.

A device that leaves takes its work with it: a request that had no first token yet is placed again on
another device (``retried``: the client sees a slower first token), one that was streaming ends failed
(``failed_mid_stream``, with its reason). A device that returns starts cold (empty caches, the router's
memory of it forgotten) and takes new work at once.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from homeai.cluster.router import NoReplicaError, Router
from homeai.policy.schema import Policy
from homeai.sim.cluster_load import class_load, replica_load
from homeai.sim.cost_model import CostModel
from homeai.sim.household import ours_mapping
from homeai.sim.simulator import RequestRecord, SimResult, Simulator
from homeai.sim.trace import TraceRequest

PUBLISH_INTERVAL_S = 0.5
DEVICE_LEFT = "device_left"  # why a request that was streaming from a device that left ended
NO_REPLICA = "no_replica"  # no live device serves its model (the gateway's 503)


@dataclass(slots=True)
class Attempt:
    """One placement of a request: the copy a device was sent, and what the front door heard of it."""

    req: TraceRequest
    origin: Origin
    device: int
    incarnation: int  # the device's life it was sent to (a device that returns is a new one)
    first_s: float | None = None
    ended: bool = False


@dataclass(slots=True)
class Origin:
    """A request as its client sees it, over every placement."""

    req: TraceRequest
    attempts: list[Attempt] = field(default_factory=list)
    failed: str | None = None  # ended without an answer here, not by a device (device_left, no_replica)
    end_s: float | None = None  # when the front door saw it end (answered, rejected or failed)
    failed_tokens: list[float] = field(default_factory=list)  # what it streamed before it failed


@dataclass(slots=True)
class Placed:
    """A placement as the router made it: when, the class, where, and every device's true load then."""

    time_s: float
    class_name: str
    device: int
    live: list[dict[str, int]]  # per device (empty: gone): class -> requests queued or running


@dataclass(slots=True)
class ClusterResult:
    """The whole cluster's figures: ``result`` holds one record per client request (its first token and
    end over all its placements), the tokens of every device life, and what is still in flight."""

    result: SimResult
    failed_mid_stream: int
    retried: int  # placements beyond the first (each retry of a request counts)
    per_device_tokens: list[int]  # useful tokens processed by each device (all its lives)
    placements: list[Placed]  # the interactive classes' placements
    end_s: dict[str, float]  # record id -> when the request ended at the front door
    failed_by_class: dict[str, int]  # class -> requests failed mid-stream


class ClusterSim:
    """``num_devices`` devices of the same kind (``cost``), one router, a trace (see the module docstring).
    ``changes`` are (time, device, "leave" | "return") events."""

    def __init__(self, policy: Policy, cost: CostModel, num_devices: int, num_kv_blocks: int = 4096,
                 background_concurrency: int = 16, publish_interval_s: float = PUBLISH_INTERVAL_S,
                 changes: tuple[tuple[float, int, str], ...] = (), costs: dict[str, CostModel] | None = None,
                 router: Router | None = None) -> None:
        self.policy, self.cost, self.costs, self.num_kv_blocks = policy, cost, costs, num_kv_blocks
        self.background_concurrency = background_concurrency
        self.publish_interval_s = publish_interval_s
        self.changes = changes
        self.router = router or Router(n for n, c in policy.classes.items() if not c.background)
        self.models = tuple(dict.fromkeys(c.model for c in policy.classes.values()))
        self.incarnation = [0] * num_devices  # a device's life: one more each time it leaves
        self.devices: list[Simulator | None] = [self._new_device(i, 0.0) for i in range(num_devices)]
        self.retired: list[tuple[int, Simulator]] = []  # devices that left, with their index
        self.loads = [replica_load(d, f"d{i}", self.models) for i, d in enumerate(self.devices) if d is not None]
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._order = itertools.count()
        self._attempts: dict[int, Attempt] = {}  # id(the copy a device was sent) -> its attempt
        self.origins: list[Origin] = []  # every request of the trace, as its client sees it
        self._backlog: dict[str, list[Origin]] = {}
        self._outstanding: dict[str, int] = {}
        self._refill_at: set[float] = set()
        self.placements: list[Placed] = []
        self.retried = 0

    # ---- devices ---------------------------------------------------------------------------------
    def _new_device(self, index: int, now: float) -> Simulator:
        sim = Simulator(copy.deepcopy(self.policy), self.cost, ours_mapping, self.num_kv_blocks,
                        costs=self.costs)
        sim.clock.set(now)
        life = self.incarnation[index]
        # Heard at the front door in time order, with every other device's events.
        sim.on_first_token = lambda rec, t: self._at(t, partial(self._first_token, rec, index, life))
        sim.on_end = lambda rec, t: self._at(t, partial(self._ended, rec, index, life))
        return sim

    def _at(self, time_s: float, handle: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (time_s, next(self._order), handle))

    def _publish(self, now: float) -> None:
        for i, sim in enumerate(self.devices):
            if sim is not None:
                self.loads[i] = replica_load(sim, f"d{i}", self.models)
        self._at(now + self.publish_interval_s, self._publish)

    def _leave(self, index: int, now: float) -> None:
        sim = self.devices[index]
        if sim is None:
            return
        self.retired.append((index, sim))
        self.devices[index] = None
        self.incarnation[index] += 1
        self.loads[index].alive = False  # the gateway hears of a node's loss at once (its actor dies)
        self.router.forget(f"d{index}")
        lost = [a for a in self._attempts.values() if a.device == index and not a.ended]
        for attempt in sorted(lost, key=lambda a: a.req.arrival_s):
            attempt.ended = True
            rec = next((r for r in sim.records.values() if r.req is attempt.req), None)
            if attempt.first_s is not None:  # streaming: the client already has part of an answer
                tokens = [t for t in (rec.token_times if rec else []) if t <= now]
                self._fail(attempt.origin, DEVICE_LEFT, now, tokens)
            else:
                self.retried += 1
                self._place(attempt.origin, now)

    def _return(self, index: int, now: float) -> None:
        if self.devices[index] is None:
            sim = self.devices[index] = self._new_device(index, now)
            self.loads[index] = replica_load(sim, f"d{index}", self.models)

    # ---- requests --------------------------------------------------------------------------------
    def _place(self, origin: Origin, now: float) -> None:
        req = origin.req
        cp = self.policy.classes[req.class_name]
        tokens = req.prompt_tokens if req.kind == "llm" else sum(req.input_tokens or [])
        try:
            placed = self.router.place(req.class_name, cp.model, tokens, (), self.loads, user=req.user)
        except NoReplicaError:
            self._fail(origin, NO_REPLICA, now, [])
            return
        index = int(placed.replica_id[1:])
        sim = self.devices[index]
        assert sim is not None  # the router places only on live devices
        if req.class_name in self.router.interactive:  # where it went, against every device's true load
            self.placements.append(Placed(now, req.class_name, index, [_live(d) for d in self.devices]))
        sent = copy.copy(req)
        sent.arrival_s = now
        attempt = Attempt(sent, origin, index, self.incarnation[index])
        origin.attempts.append(attempt)
        self._attempts[id(sent)] = attempt
        self.router.dispatched(placed.replica_id, req.class_name, tokens, (), req.user)
        sim.post(sent)

    def _fail(self, origin: Origin, reason: str, now: float, tokens: list[float]) -> None:
        origin.failed, origin.end_s, origin.failed_tokens = reason, now, tokens
        self._background_ended(origin.req, now)

    def _current(self, rec: RequestRecord, index: int, life: int) -> Attempt | None:
        attempt = self._attempts.get(id(rec.req))
        if attempt is None or attempt.ended or life != self.incarnation[index]:
            return None  # from a device that has left since
        return attempt

    def _first_token(self, rec: RequestRecord, index: int, life: int, _now: float) -> None:
        attempt = self._current(rec, index, life)
        if attempt is not None and attempt.first_s is None:
            attempt.first_s = rec.first_s
            self.router.first_token(f"d{index}", rec.req.class_name, _tokens(rec.req))

    def _ended(self, rec: RequestRecord, index: int, life: int, now: float) -> None:
        attempt = self._current(rec, index, life)
        if attempt is None:
            return
        attempt.ended = True
        attempt.origin.end_s = now
        self.router.ended(f"d{index}", rec.req.class_name, _tokens(rec.req), attempt.first_s is not None,
                          rec.req.user)
        self._background_ended(rec.req, now)

    # ---- the background jobs: closed-loop clients of the whole cluster ---------------------------
    def _background_ended(self, req: TraceRequest, now: float) -> None:
        if req.background and req.class_name in self._outstanding:
            self._outstanding[req.class_name] -= 1
            self._refill(now)

    def _refill(self, now: float) -> None:
        self._refill_at.discard(now)
        for cls, backlog in self._backlog.items():
            while backlog and backlog[-1].req.arrival_s <= now \
                    and self._outstanding.get(cls, 0) < self.background_concurrency:
                self._outstanding[cls] = self._outstanding.get(cls, 0) + 1
                self._place(backlog.pop(), now)
            if backlog and backlog[-1].req.arrival_s > now and backlog[-1].req.arrival_s not in self._refill_at:
                self._refill_at.add(backlog[-1].req.arrival_s)
                self._at(backlog[-1].req.arrival_s, self._refill)

    # ---- the run ---------------------------------------------------------------------------------
    def run(self, trace: list[TraceRequest], horizon_s: float) -> ClusterResult:
        for req in sorted(trace, key=lambda r: r.arrival_s):
            origin = Origin(req)
            self.origins.append(origin)
            if req.background:
                self._backlog.setdefault(req.class_name, []).append(origin)
            else:
                self._at(req.arrival_s, partial(self._place, origin))
        for backlog in self._backlog.values():
            backlog.reverse()  # pop() takes them in trace order
        self._at(0.0, self._refill)
        self._at(self.publish_interval_s, self._publish)
        for time_s, index, what in self.changes:
            self._at(time_s, partial(self._leave if what == "leave" else self._return, index))
        while True:
            due = min(self._events[0][0], horizon_s) if self._events else horizon_s
            behind = [d for d in self.devices if d is not None and d.clock.now() < due]
            if behind:  # the device furthest behind runs its next iteration first
                min(behind, key=lambda d: d.clock.now()).step(due)
                continue
            if due >= horizon_s:
                break
            time_s, _, handle = heapq.heappop(self._events)
            handle(time_s)
        return self._result(horizon_s)

    def _result(self, horizon_s: float) -> ClusterResult:
        lives = [(i, d) for i, d in self.retired] + [(i, d) for i, d in enumerate(self.devices) if d is not None]
        device_records = {id(r.req): r for _, d in lives for r in d.records.values()}
        live_in_flight = {id(d): d.result(horizon_s).in_flight for d in self.devices if d is not None}
        in_flight: set[str] = set()
        records: list[RequestRecord] = []
        for k, origin in enumerate(self.origins):
            rec = RequestRecord(origin.req, f"q{k}")
            records.append(rec)
            last = origin.attempts[-1] if origin.attempts else None
            if origin.failed is not None:
                rec.rejected = origin.failed
                rec.token_times = origin.failed_tokens
                rec.first_s = origin.failed_tokens[0] if origin.failed_tokens else None
                continue
            if last is None:
                in_flight.add(rec.rid)  # a background job's request not sent yet
                continue
            sent = device_records.get(id(last.req))
            sim = self.devices[last.device]
            if sent is None:  # still in the device's inbox at the horizon
                if sim is not None and last.incarnation == self.incarnation[last.device]:
                    in_flight.add(rec.rid)
                continue
            rec.first_s, rec.token_times, rec.done_s, rec.rejected = \
                sent.first_s, sent.token_times, sent.done_s, sent.rejected
            if sim is not None and last.incarnation == self.incarnation[last.device] \
                    and sent.rid in live_in_flight[id(sim)]:
                in_flight.add(rec.rid)
        processed: dict[str, int] = {}
        wasted: dict[str, int] = {}
        busy: dict[str, float] = {}
        per_device = [0] * len(self.devices)
        steps = batches = preemptions = futile = 0
        for i, d in lives:
            res = d.result(horizon_s)
            for name, n in res.processed_tokens.items():
                processed[name] = processed.get(name, 0) + n
                per_device[i] += res.useful_tokens(name)
            for name, n in res.wasted_tokens.items():
                wasted[name] = wasted.get(name, 0) + n
            for name, s in res.busy_s.items():
                busy[name] = busy.get(name, 0.0) + s
            steps, batches = steps + res.num_llm_steps, batches + res.num_embed_batches
            preemptions, futile = preemptions + res.num_preemptions, futile + res.num_futile_preemptions
        result = SimResult(records, horizon_s, processed, steps, batches, preemptions, busy, in_flight, futile, wasted)
        failed = [o.req.class_name for o in self.origins if o.failed == DEVICE_LEFT]
        end_s = {rec.rid: o.end_s for rec, o in zip(records, self.origins, strict=True) if o.end_s is not None}
        return ClusterResult(result, len(failed), self.retried, per_device, self.placements, end_s,
                             {c: failed.count(c) for c in sorted(set(failed))})


def _tokens(req: TraceRequest) -> int:
    return req.prompt_tokens if req.kind == "llm" else sum(req.input_tokens or [])


def _live(sim: Simulator | None) -> dict[str, int]:
    """Requests queued or running on a device, by class (empty for a device that is gone)."""
    if sim is None:
        return {}
    queued, running = class_load(sim)
    return {name: queued.get(name, 0) + running.get(name, 0) for name in {*queued, *running}}
