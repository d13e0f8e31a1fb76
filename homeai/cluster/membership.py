"""The front door's view of the cluster: which nodes offer a device, their replicas, and each one's load.

A thread polls Ray's node table (``ray.nodes()``) and every replica's ``load`` twice a second. A node
that joins gets a replica (an ``EngineReplica`` actor pinned to it); one that leaves (powered off, network
gone, process killed: Ray marks it dead, or its actor stops answering) is marked ``left`` at once, its
replica forgotten by the router, and its requests fail over (cluster_gateway). A node that comes back is a
new Ray node: it gets a new replica and is used again as soon as its models are loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from homeai.cluster.node_spec import REPLICA_RESOURCE, NodeSpec, label_value, spec_of
from homeai.cluster.replica import EngineReplica
from homeai.cluster.router import ReplicaLoad
from homeai.gateway.gateway import GatewayConfig
from homeai.policy.schema import Policy
from homeai.policy.store import PolicyHolder

log = logging.getLogger(__name__)

POLL_S = 0.5
LOAD_TIMEOUT_S = 3.0  # a replica that does not answer its load poll this long is taken for gone
REPLICA_CONCURRENCY = 1024  # requests one replica streams at once (its queues refuse beyond their limits)


def models_for(policy: Policy, spec: NodeSpec, replicas_now: Counter[str]) -> list[str]:
    """The LLMs a joining node's replica serves: the policy's ``cluster.nodes`` entry for it, else what
    the node named at join (``--models``), else every LLM of the policy; without those whose
    ``cluster.replicas`` count is reached. Empty: the node stands by (a replica that leaves frees a place)."""
    llms = policy.llm_models()
    # the node's name as Ray holds it ("Gaming PC" joins as "Gaming-PC"): the policy's key in that form too
    named = next((entry for key, entry in policy.cluster.nodes.items() if label_value(key) == spec.name), None)
    if named is not None:
        wanted = list(named.models)
    elif spec.models:  # what it named at join; none the policy serves (a typo): it stands by, and says why
        wanted = [m for m in spec.models if m in llms]
        if not wanted:
            log.warning("node %s named models %s at join, none of them an LLM of the policy (%s): it stands by",
                        spec.name, ", ".join(spec.models), ", ".join(sorted(llms)))
    else:
        wanted = list(llms)
    limits = policy.cluster.replicas
    return [m for m in wanted if m not in limits or replicas_now[m] < limits[m]]


@dataclass(slots=True)
class ReplicaState:
    spec: NodeSpec
    handle: Any
    models: list[str] = field(default_factory=list)  # what it serves (chosen when it was placed)
    state: str = "loading"  # loading -> ready -> left; standby: nothing to serve (the policy's cluster section)
    since_s: float = field(default_factory=time.time)
    load: ReplicaLoad | None = None
    pending: Any = None  # the ObjectRef of the ``ready`` call while loading
    error: str | None = None
    swap: Any = None  # the ObjectRef of its latest ``set_policy`` call, until the poll has checked it
    swap_error: str | None = None  # that swap failed there: it kept its old policy, and takes no request

    @property
    def replica_id(self) -> str:
        return self.spec.node_id


class Membership:
    def __init__(self, policy_holder: PolicyHolder, config: GatewayConfig, on_left: Callable[[str], None],
                 shared_counters: Callable[[], dict[str, dict[str, float]]] = dict, poll_s: float = POLL_S) -> None:
        self.policy_holder = policy_holder
        self.config = config
        self.on_left = on_left
        self.shared_counters = shared_counters  # the cluster's VTC counters, sent with every load poll
        self.poll_s = poll_s
        self.replicas: dict[str, ReplicaState] = {}  # node id -> replica (a left one is kept to be shown)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._actor_class: Any = ray.remote(EngineReplica)
        self._unsubscribe = policy_holder.subscribe(lambda p, _v: self._policy_swapped(p))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="homeai-membership", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._unsubscribe()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for rep in list(self.replicas.values()):
            if rep.state in ("loading", "ready"):
                try:
                    ray.kill(rep.handle, no_restart=True)
                except Exception:  # the node may be gone already
                    pass

    # ---- what the gateway reads ------------------------------------------------------------------
    def loads(self) -> list[ReplicaLoad]:
        with self._lock:
            return [r.load for r in self.replicas.values() if r.state == "ready" and r.load is not None]

    def handle(self, replica_id: str) -> Any:
        with self._lock:
            rep = self.replicas.get(replica_id)
            return rep.handle if rep is not None and rep.state == "ready" else None

    def name_of(self, replica_id: str) -> str:
        rep = self.replicas.get(replica_id)
        return rep.spec.name if rep is not None else replica_id[:8]

    def lost(self, replica_id: str, why: str, handle: Any = None) -> None:
        """A stream found the replica gone (its actor died): mark it at once, not at the next poll. With
        ``handle`` (the actor the stream was from), only while that is still the replica's actor: a slow
        reader of a dead actor's stream must not take down the one placed on its node since."""
        with self._lock:
            rep = self.replicas.get(replica_id)
            if handle is not None and rep is not None and rep.handle is not handle:
                return
        self._leave(replica_id, why)

    def nodes(self) -> list[dict[str, Any]]:
        """Each node with a replica, as ``/v1/stats`` shows it (left ones included)."""
        with self._lock:
            reps = list(self.replicas.values())
        out = []
        for r in reps:
            load = r.load
            out.append({"name": r.spec.name, "node_id": r.spec.node_id, "address": r.spec.address,
                        "device": r.spec.device, "models": list(load.models if load else r.models),
                        "state": r.state, "replica": r.replica_id,
                        "running": dict(load.running) if load else {}, "queued": dict(load.queued) if load else {},
                        "free_kv_tokens": load.free_kv_tokens if load else 0, "since_s": r.since_s,
                        "error": r.error or r.swap_error})
        return out

    # ---- the poll --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                log.exception("cluster poll failed")
            self._stop.wait(self.poll_s)

    def refresh(self) -> None:
        alive: dict[str, NodeSpec] = {}
        for node in ray.nodes():
            spec = spec_of(node)
            if spec is not None and node.get("Alive"):
                alive[spec.node_id] = spec
        for node_id, rep in list(self.replicas.items()):
            if rep.state == "standby" and node_id not in alive:
                with self._lock:  # loads() and nodes() iterate the dict on other threads
                    del self.replicas[node_id]
            elif rep.state != "left" and node_id not in alive:
                self._leave(node_id, "node left the cluster")
        for node_id, spec in alive.items():
            known = self.replicas.get(node_id)
            if known is None or known.state == "standby" or known.state == "left" and known.error == "replica died":
                self._place(spec)
        self._poll_loads()

    def _replicas_of_models(self) -> Counter[str]:
        return Counter(m for r in self.replicas.values() if r.state in ("loading", "ready") for m in r.models)

    def _place(self, spec: NodeSpec) -> None:
        """Start a replica on the node (it loads its models; ``ready`` answers once they are loaded), or
        keep the node standing by when the policy gives it nothing to serve. A node back under a new id (a
        restart, a dropped link) replaces its entries that left: each stayed for good, one more row a time."""
        with self._lock:
            for old in [i for i, r in self.replicas.items()
                        if r.state == "left" and r.spec.name == spec.name and i != spec.node_id]:
                del self.replicas[old]
        models = models_for(self.policy_holder.current, spec, self._replicas_of_models())
        if not models:
            known = self.replicas.get(spec.node_id)
            if known is not None and known.state == "standby":
                return
            with self._lock:
                self.replicas[spec.node_id] = ReplicaState(spec, None, state="standby")
            log.info("node %s stands by: the policy's cluster section gives it no model to serve", spec.name)
            return
        config = replace(self.config, device=spec.device, models_dir=None, cache_dir=None)
        handle: Any = self._actor_class.options(
            num_cpus=0, resources={REPLICA_RESOURCE: 1}, max_restarts=0, max_task_retries=0,
            max_concurrency=REPLICA_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(spec.node_id, soft=False),
        ).remote(self.policy_holder.current, config, models, spec.name)
        with self._lock:
            self.replicas[spec.node_id] = ReplicaState(spec, handle, models, pending=handle.ready.remote())
        log.info("node %s (%s, %s) joined: starting its replica", spec.name, spec.address, spec.device)

    def _poll_loads(self) -> None:
        self._check_swaps()
        for rep in list(self.replicas.values()):
            if rep.state == "loading":
                done, _ = ray.wait([rep.pending], timeout=0)
                if not done:
                    continue
                try:
                    info = ray.get(rep.pending)
                except Exception as exc:
                    self._leave(rep.replica_id, f"replica failed to start: {exc}")
                    continue
                rep.pending = None  # loaded: its first load poll below makes it ready
                log.info("node %s loaded: %s on %s", rep.spec.name, info["models"], info["device"])
        counters = self.shared_counters()
        pending = {rep.replica_id: rep.handle.load.remote(counters) for rep in list(self.replicas.values())
                   if rep.state == "ready" or rep.state == "loading" and rep.pending is None}
        for replica_id, ref in pending.items():
            try:
                data = ray.get(ref, timeout=LOAD_TIMEOUT_S)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError):
                continue  # busy, or a network hiccup: Ray's health check decides whether the node is gone
            except ray.exceptions.RayActorError as exc:
                self._leave(replica_id, "replica died", str(exc))
                continue
            self._loaded(replica_id, data)

    def _loaded(self, replica_id: str, data: dict[str, Any]) -> None:
        with self._lock:
            rep = self.replicas.get(replica_id)
            if rep is None or rep.state == "left":
                return
            rep.load = ReplicaLoad(replica_id, node=rep.spec.name, device=data["device"],
                                   models=tuple(data["models"]), loaded=tuple(data.get("loaded", data["models"])),
                                   base_s=data["base_s"], row_s=data["row_s"],
                                   prompt_token_s=data["prompt_token_s"], free_kv_tokens=data["free_kv_tokens"],
                                   block_size=data["block_size"], queued=data["queued"], running=data["running"],
                                   ready=rep.swap_error is None, failing=bool(data.get("failing", False)),
                                   per_model=data.get("per_model", {}), load_s=data.get("load_s", {}))
            if rep.state == "loading":
                rep.state, rep.since_s = "ready", time.time()

    def _leave(self, replica_id: str, why: str, detail: str = "") -> None:
        with self._lock:
            rep = self.replicas.get(replica_id)
            if rep is None or rep.state in ("left", "standby"):
                return
            rep.state, rep.since_s, rep.error = "left", time.time(), why
        log.warning("node %s left: %s %s", rep.spec.name, why, detail)
        self.on_left(replica_id)
        try:
            ray.kill(rep.handle, no_restart=True)
        except Exception:  # the node is gone with it
            pass

    def _policy_swapped(self, policy: Policy) -> None:
        """Send the new policy to every replica; whoever swapped does not wait for them (the poll checks)."""
        with self._lock:
            reps = [r for r in self.replicas.values() if r.state in ("loading", "ready")]
        for rep in reps:
            ref = rep.handle.set_policy.remote(policy)
            with self._lock:
                rep.swap = ref

    def _check_swaps(self) -> None:
        """The policy swaps the replicas finished (on this thread, never the event loop): a replica whose
        swap failed kept its old policy, so it takes no request until a later swap succeeds there."""
        for rep in list(self.replicas.values()):
            ref = rep.swap
            if ref is None or not ray.wait([ref], timeout=0)[0]:
                continue
            error = None
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass  # it died: its load poll finds it gone
            except Exception as exc:
                error = f"policy swap failed: {exc}"
            with self._lock:
                if rep.swap is not ref:  # a newer swap was sent meanwhile: that one decides
                    continue
                rep.swap, rep.swap_error = None, error
                if rep.load is not None:
                    rep.load = replace(rep.load, ready=error is None)
            if error is not None:
                log.error("node %s kept its old policy (no request goes there until a swap succeeds): %s",
                          rep.spec.name, error)
