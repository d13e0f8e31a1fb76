"""The front door of a cluster: the single-box gateway (its own device is the replica named ``local``) plus
the replicas on Ray nodes, with every LLM request placed by the router.

Everything but the steps stays here: HTTP, auth, policies, admission (prompts are built and checked by
the local engine's tokenizer), metering, the store, jobs, embeddings. ``generate`` places a request
(``Router.place``), streams its deltas from the chosen replica, and handles a replica that fails:

- before the first token (a refusal of a full queue, a dead actor, a node that left, an engine error there):
  the request is placed again on another replica; only when none is left does the client see the refusal
  (429/503) or the engine's error;
- after it: the stream ends with an error delta that names the node, in the client's API format.

So every request ends finished, rejected, timed out or failed with a reason, never lost. A class's
``max_queue_size`` holds across the cluster: the requests the replicas last published as queued in the
class, summed, are held to it here before a replica's own queue is asked. As on a single box, a full queue
does not lock the household out behind one key: a user who waits with at least two fewer requests of the
class than the user who waits with the most is still placed (up to twice the limit in all), and the
replica's own queue, where full, pushes out that heaviest user's newest request.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import ray

from homeai.cluster.membership import Membership
from homeai.cluster.replica import MODEL_RETRY_AFTER_S, Refusal, ReplicaRequest, gateway_load
from homeai.cluster.router import NoReplicaError, ReplicaLoad, Router, prompt_prefix
from homeai.cluster.shared_fairness import SharedCounters
from homeai.core.block_hash import BlockHash
from homeai.core.types import SamplingParams, TokenDelta
from homeai.engine.errors import (
    REPLICA_LOST,
    ModelCapacityError,
    ModelLoadError,
    ModelUnloadedError,
    QueueTimeoutError,
    RequestError,
    ShuttingDownError,
)
from homeai.gateway.gateway import Gateway, Route
from homeai.gateway.metering import Submission
from homeai.policy.schema import Policy
from homeai.scheduling.class_queue import QueueFullError

log = logging.getLogger(__name__)

LOCAL = "local"
FULL_RETRY_AFTER_S = 1.0
SERVED_BY_KEPT = 10_000


class ReplicaLostError(RuntimeError):
    """The replica's actor died or its node left while it held the request."""


@dataclass
class ClusterGateway(Gateway):
    """A Gateway whose LLM requests may run on any replica of the cluster it connected to."""

    cluster_address: str = ""
    serve_locally: bool = True  # the front door's own device is a replica too
    router: Router = field(default_factory=Router)
    membership: Membership | None = None
    fairness: SharedCounters | None = None  # one VTC counter per user across replicas
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (replica, served|failed) -> requests
    served_by: OrderedDict[str, str] = field(default_factory=OrderedDict)  # request id -> node, the latest ones
    remote_streams: set[Any] = field(default_factory=set)  # the replicas' answer streams open now (Ray's)
    # class -> user -> requests placed here that have not had their first delta yet (queued somewhere)
    waiting: dict[str, Counter[str]] = field(default_factory=dict)

    def start(self) -> None:
        super().start()
        if not ray.is_initialized():
            ray.init(address=self.cluster_address or "auto", namespace="homeai", log_to_driver=False)
        self._interactive_from(self.policy)
        self.fairness = SharedCounters(self.policy)
        self.policy_holder.subscribe(lambda p, _v: self._interactive_from(p))
        self.membership = Membership(self.policy_holder, self.config, self.router.forget, self._share_counters)
        self.membership.start()

    def shutdown(self) -> None:
        if self.membership is not None:
            self.membership.stop()
            self.membership = None
        super().shutdown()

    def _interactive_from(self, policy: Policy) -> None:
        self.router.set_interactive(n for n, cp in policy.classes.items() if cp.kind == "llm" and not cp.background)
        if self.fairness is not None:
            self.fairness.apply_policy(policy)

    def _share_counters(self) -> dict[str, dict[str, float]]:
        """At each membership poll: the cluster's VTC counters, which this device's engines take now and
        the replicas with their load poll."""
        assert self.fairness is not None
        counters = self.fairness.snapshot()
        if self.serve_locally:
            for engine in self.llms.values():
                engine.share_counters(counters)
        return counters

    # ---- placing ---------------------------------------------------------------------------------
    def replica_loads(self) -> list[ReplicaLoad]:
        loads = list(self.membership.loads()) if self.membership is not None else []
        if self.serve_locally and self.llms:
            local = gateway_load(self)
            loads.append(ReplicaLoad(LOCAL, node=LOCAL, device=local["device"], models=tuple(local["models"]),
                                     loaded=tuple(local["loaded"]),
                                     base_s=local["base_s"], row_s=local["row_s"],
                                     prompt_token_s=local["prompt_token_s"], free_kv_tokens=local["free_kv_tokens"],
                                     block_size=local["block_size"], queued=local["queued"],
                                     running=local["running"], failing=local["failing"],
                                     per_model=local["per_model"], load_s=local["load_s"]))
        return loads

    def generate(self, route: Route, prompt_ids: list[int], params: SamplingParams, user: str,
                 request_id: str | None = None, priority_level: int | None = None,
                 timeout_us: int | None = None, kind: str = "completion") -> AsyncGenerator[TokenDelta, None]:
        self.apply_class_limits(route, prompt_ids, params)
        request_id = request_id or uuid.uuid4().hex
        req = ReplicaRequest(request_id, route.model, route.class_name, prompt_ids, params, user, priority_level,
                             timeout_us, kind)
        sub = Submission(request_id, kind, route.class_name, user, route.model, len(prompt_ids))
        return self.meter.stream(sub, self._placed(req))

    def _check_global_queue(self, req: ReplicaRequest, loads: list[ReplicaLoad]) -> None:
        """429 when the class's queues hold its limit across the cluster, except for a user who waits with at
        least two fewer of its requests than the user who waits with the most (a single box's push-out rule):
        one key that fills the class must not refuse everyone else. Twice the limit refuses everyone."""
        cp = self.class_policy(req.class_name)
        limit = cp.queue_policy(req.priority_level or cp.default_priority_level).max_queue_size
        queued = sum(r.queued.get(req.class_name, 0) for r in loads)
        if limit and queued >= limit:
            waiting = self.waiting.get(req.class_name, Counter())
            heaviest = max(waiting.values(), default=0)
            if queued >= 2 * limit or heaviest < waiting[req.user] + 2:
                raise QueueFullError(FULL_RETRY_AFTER_S, req.class_name,
                                     req.priority_level or cp.default_priority_level)

    def _count_waiting(self, req: ReplicaRequest, delta: int) -> None:
        users = self.waiting.setdefault(req.class_name, Counter())
        users[req.user] += delta
        if users[req.user] <= 0:
            del users[req.user]  # only users with a request waiting have an entry

    async def _placed(self, req: ReplicaRequest) -> AsyncGenerator[TokenDelta, None]:
        """The request's deltas from the replicas (``_placements``), with the front door's copy of the model
        leased meanwhile: its tokenizer reads the answer, so keep_alive must not unload it mid-request while
        a node serves it."""
        if self.pool is not None:
            self.pool.lease(req.model)
        stream = self._placements(req)
        try:
            async for delta in stream:
                yield delta
        finally:
            await stream.aclose()  # a client that left: the replica's stream is closed, which aborts it
            if self.pool is not None:
                self.pool.release(req.model)

    async def _placements(self, req: ReplicaRequest) -> AsyncGenerator[TokenDelta, None]:
        """The request's deltas from the replica the router picks, placed again while no token came."""
        prefix = prompt_prefix(req.model, req.prompt_ids)
        loads = self.replica_loads()
        self._check_global_queue(req, loads)
        self._count_waiting(req, 1)
        waiting = True
        placing = self._placement_loop(req, prefix, loads)
        try:
            async for delta in placing:
                if waiting:  # its first delta: no longer queued anywhere
                    self._count_waiting(req, -1)
                    waiting = False
                yield delta
        finally:
            await placing.aclose()  # now, not at garbage collection: it closes the replica's stream (an abort)
            if waiting:
                self._count_waiting(req, -1)

    async def _placement_loop(self, req: ReplicaRequest, prefix: list[BlockHash],
                              loads: list[ReplicaLoad]) -> AsyncGenerator[TokenDelta, None]:
        tried: set[str] = set()
        refusal: Refusal | None = None
        failure: TokenDelta | None = None  # the error delta of a replica that failed before any token
        while True:
            if self.closing is not None:  # the drain's deadline passed while it waited to be placed
                raise ShuttingDownError(self.closing)
            try:
                placement = self.router.place(req.class_name, req.model, len(req.prompt_ids), prefix, loads,
                                              exclude=tried, user=req.user)
            except NoReplicaError:
                if failure is not None and refusal is not None and refusal.kind == "failed":
                    yield failure  # no other replica: the engine's error, as a single box answers it
                    return
                raise self._unplaced(req, refusal) from None
            rid = placement.replica_id
            tried.add(rid)
            self._record_node(req.request_id, rid)
            self.router.dispatched(rid, req.class_name, len(req.prompt_ids), prefix, req.user)
            first, streamed = False, 0
            stream = self._stream_from(rid, req)
            try:
                async for item in stream:
                    if self.closing is not None and rid != LOCAL:  # the drain's deadline: a remote replica
                        # gets no fail-all from here (the local engines do), so its stream ends here, with the
                        # error every API turns into its final message (leaving it aborts it there)
                        yield TokenDelta(req.request_id, "", [], len(req.prompt_ids), streamed, error=self.closing)
                        return
                    if isinstance(item, Refusal):
                        if item.kind == "invalid":
                            raise RequestError(item.message)
                        if item.kind == "timeout":  # it waited its whole queue timeout there: 503, not again
                            raise QueueTimeoutError(item.message)
                        refusal = item
                        break  # a full queue there: placed again below
                    if not first and self._failed_unstreamed(item):  # nothing reached the client: again
                        refusal, failure = self._failed_there(req, rid, item), item
                        break
                    if not first and (item.token_ids or item.finished or item.error is not None):
                        first = True
                        self.router.first_token(rid, req.class_name, len(req.prompt_ids))
                        # as a single box charges at admission: the prompt tokens it computed (a cached
                        # prefix costs nothing), and nothing for a request that timed out in its queue
                        if not item.timed_out:
                            self._charge(req, len(req.prompt_ids) - item.num_cached_tokens, 0)
                    if item.token_ids:
                        self._charge(req, 0, len(item.token_ids))
                        streamed += len(item.token_ids)
                    if item.finished or item.error is not None:  # the consumer stops at the final delta
                        self.outcomes[rid, "failed" if item.error is not None else "served"] += 1
                        yield item
                        return
                    yield item
                else:
                    if self.closing is not None and rid != LOCAL:  # cut at the drain's deadline
                        yield TokenDelta(req.request_id, "", [], len(req.prompt_ids), streamed, error=self.closing)
                        return
                    if first:  # ended without a final delta: the replica went away mid-stream
                        yield self._failed(req, rid, "its stream ended early", streamed)
                        return
            except ReplicaLostError as exc:
                if self.closing is not None:  # cut at the drain's deadline (``end_remote_streams``), not lost
                    yield TokenDelta(req.request_id, "", [], len(req.prompt_ids), streamed, error=self.closing)
                    return
                if first:
                    yield self._failed(req, rid, str(exc), streamed)
                    return
                log.warning("request %s: replica %s lost before its first token; placing it again", req.request_id,
                            self._name(rid))
                refusal = Refusal("lost", str(exc))
            except QueueFullError as exc:  # the local replica's queue: another replica may take it
                refusal = Refusal("full", str(exc), exc.retry_after_s)
            finally:
                self.router.ended(rid, req.class_name, len(req.prompt_ids), first, req.user)
                await stream.aclose()  # a replica's stream left unread (a client that left): it aborts there
            loads = self.replica_loads()

    @staticmethod
    def _unplaced(req: ReplicaRequest, refusal: Refusal | None) -> Exception:
        """What the client gets when no replica is left to try: the last refusal, as its status."""
        if refusal is not None and refusal.kind == "full":
            return QueueFullError(refusal.retry_after_s, req.class_name)
        return QueueTimeoutError(f"no replica could take the request: {refusal.message if refusal else 'none'}")

    def _failed_unstreamed(self, item: TokenDelta) -> bool:
        """An error delta before any token: the replica failed the request (a step that failed on its device)
        and nothing reached the client, so another may serve it. Not a queue timeout (a 503: it waited its
        whole timeout there) nor the drain's error (nothing starts after it)."""
        return item.error is not None and not item.token_ids and not item.timed_out and self.closing is None

    def _failed_there(self, req: ReplicaRequest, rid: str, item: TokenDelta) -> Refusal:
        self.outcomes[rid, "failed"] += 1
        log.warning("request %s: node %s failed it before its first token (%s); placing it elsewhere if it can",
                    req.request_id, self._name(rid), item.error)
        return Refusal("failed", item.error or "engine error")

    def _charge(self, req: ReplicaRequest, input_tokens: int, output_tokens: int) -> None:
        if self.fairness is not None:
            self.fairness.charge(req.class_name, req.user, input_tokens, output_tokens)

    def _record_node(self, request_id: str, rid: str) -> None:
        """Which node serves the request (its last placement), for the stats and the request log."""
        self.served_by[request_id] = self._name(rid)
        self.meter.placed(request_id, self.served_by[request_id])  # the request log's node column
        self.served_by.move_to_end(request_id)
        while len(self.served_by) > SERVED_BY_KEPT:
            self.served_by.popitem(last=False)
        log.debug("request %s placed on node %s", request_id, self.served_by[request_id])

    def _failed(self, req: ReplicaRequest, rid: str, why: str, streamed: int) -> TokenDelta:
        self.outcomes[rid, "failed"] += 1
        message = f"{REPLICA_LOST}: node {self._name(rid)} failed while serving the request: {why}"
        log.warning("request %s: %s", req.request_id, message)
        return TokenDelta(req.request_id, "", [], len(req.prompt_ids), streamed, error=message)

    def _name(self, rid: str) -> str:
        return LOCAL if rid == LOCAL or self.membership is None else self.membership.name_of(rid)

    async def _stream_from(self, rid: str, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        if rid == LOCAL:
            async for item in self._stream_locally(req):
                yield item
            return
        assert self.membership is not None
        handle = self.membership.handle(rid)
        if handle is None:
            raise ReplicaLostError("the node left")
        gen = handle.generate.options(num_returns="streaming").remote(req)
        self.remote_streams.add(gen)
        done = False
        try:
            async for ref in gen:
                item = await ref
                done = isinstance(item, Refusal) or item.finished or item.error is not None
                yield item
        except ray.exceptions.ActorUnavailableError as exc:  # this stream is gone; the actor may not be
            raise ReplicaLostError(type(exc).__name__) from exc
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError) as exc:
            self.membership.lost(rid, "replica died", handle)
            raise ReplicaLostError(type(exc).__name__) from exc
        except ray.exceptions.RayError as exc:  # the replica raised (a task error, one Ray could not rebuild)
            raise ReplicaLostError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.remote_streams.discard(gen)
            if not done:
                ray.cancel(gen)  # the client left (or we gave up): the replica aborts the sequence

    def end_remote_streams(self) -> None:
        """At the drain's deadline: cancel every replica stream open now. One waiting for its first delta (queued
        there, in a long prompt step, or behind a model's load) got nothing to end it at, so uvicorn cut it
        with no final message while the node went on; its reader now ends with the shutdown error."""
        for gen in list(self.remote_streams):
            try:
                ray.cancel(gen)
            except Exception:  # noqa: BLE001 - one stream that cannot be cancelled must not keep the others open
                log.exception("cancelling a replica stream at the drain's deadline failed")

    async def _stream_locally(self, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        """The front door's own device as a replica. Its model is loaded first if it left (keep_alive may
        have unloaded it while a node served the request now placed here again), as a replica does."""
        try:
            engine = await self.ensure_llm(req.model, req.timeout_us / 1e6 if req.timeout_us else None,
                                           req.class_name)
        except (ModelCapacityError, ModelLoadError, ModelUnloadedError) as exc:  # another replica may have it
            yield Refusal("unavailable", str(exc), MODEL_RETRY_AFTER_S)
            return
        stream = self._leased(Route(req.model, req.class_name), engine, lambda engine: engine.generate(
            req.prompt_ids, req.params, req.request_id, req.class_name, req.user, req.priority_level or None,
            req.timeout_us or None), req.timeout_us)
        try:
            async for delta in stream:
                yield delta
        finally:
            await stream.aclose()

    # ---- stats -----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        snap = super().snapshot()
        nodes = list(self.membership.nodes()) if self.membership is not None else []
        for node in nodes:
            rid = node["replica"]
            node.update(served=self.outcomes[rid, "served"], failed=self.outcomes[rid, "failed"])
        if self.serve_locally:
            local = gateway_load(self)
            nodes.insert(0, {"name": LOCAL, "node_id": LOCAL, "address": "", "device": local["device"],
                             "models": local["models"], "state": "ready", "replica": LOCAL,
                             "running": local["running"], "queued": local["queued"],
                             "free_kv_tokens": local["free_kv_tokens"], "served": self.outcomes[LOCAL, "served"],
                             "failed": self.outcomes[LOCAL, "failed"], "since_s": self.started_s, "error": None})
        snap["cluster"] = {"nodes": nodes}
        classes = {c: dict(v) for c, v in snap.get("classes", {}).items()}  # never the published dicts
        snap["classes"] = classes
        for node in nodes:  # a class's queue and running requests across the cluster (the local ones are in)
            if node["replica"] == LOCAL or node["state"] != "ready":
                continue
            for key in ("queued", "running"):
                for cls, count in node[key].items():
                    entry = classes.setdefault(cls, {"queued": 0, "running": 0})
                    entry[key] = entry.get(key, 0) + count
        return snap
