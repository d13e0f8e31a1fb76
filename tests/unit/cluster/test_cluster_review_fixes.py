"""Review findings on the cluster: a node given some of the policy's models, a replica whose policy swap
failed, a replica whose engine keeps failing, and the membership dict read while a standby node leaves.
Ray is stubbed: no cluster starts."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest
import yaml

import homeai.cluster.membership as membership_module
from homeai.cluster.membership import Membership
from homeai.cluster.replica import gateway_load, llm_only
from homeai.cluster.router import ReplicaLoad, Router
from homeai.gateway.gateway import GatewayConfig
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.policy.store import PolicyHolder

CLASSES = {"voice": {"kind": "llm", "model": "small", "priority": 0},
           "chat": {"kind": "llm", "model": "large", "priority": 1},
           "embedding": {"kind": "embedding", "model": "minilm", "priority": 2}}


def policy(cluster: dict[str, Any] | None = None, classes: dict[str, Any] = CLASSES) -> Policy:
    doc: dict[str, Any] = {"classes": classes}
    if cluster is not None:
        doc["cluster"] = cluster
    return parse_policy(yaml.safe_dump(doc), source="test")


# ---- finding 1: a replica given some of the models -------------------------------------------------

def test_a_replica_given_some_models_gets_a_valid_policy_without_the_cluster_section() -> None:
    """The cluster section named the models the replica does not serve: the subset failed the policy's
    cross-check ("no llm class names model"), and the replica never started."""
    p = policy({"nodes": {"gaming-pc": {"models": ["large"]}, "nas": {"models": ["small"]}},
                "replicas": {"small": 1}})
    sub = llm_only(p, ["large"])
    assert sorted(sub.classes) == ["chat"] and not sub.cluster.nodes and not sub.cluster.replicas


class ActorDied(Exception):
    pass


class Handle:
    """An actor handle whose method calls return (handle, method, args) as their object refs."""

    def __init__(self, name: str) -> None:
        self.name, self.refuse_policy, self.failing = name, False, False

    def __getattr__(self, method: str) -> Any:
        return types.SimpleNamespace(remote=lambda *args: (self, method, args))


class FakeRay:
    """``ray`` as membership uses it: nodes that can be changed, actors that answer at once."""

    def __init__(self, nodes: list[str]) -> None:
        self.node_names = nodes
        self.calls: list[tuple[str, str]] = []
        self.exceptions = types.SimpleNamespace(GetTimeoutError=TimeoutError, ActorUnavailableError=KeyError,
                                                RayActorError=ActorDied)
        self._handles = iter(Handle(f"h{i}") for i in range(100))

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": n, "Alive": True, "Resources": {"homeai_device": 1.0}, "Labels": {"homeai-node": n}}
                for n in self.node_names]

    def remote(self, cls: Any) -> Any:
        actor_class: Any = types.SimpleNamespace(remote=lambda *a: next(self._handles))
        actor_class.options = lambda **kw: actor_class
        return actor_class

    def wait(self, refs: list[Any], timeout: float = 0) -> tuple[list[Any], list[Any]]:
        return refs, []

    def kill(self, handle: Any, no_restart: bool = True) -> None:
        pass

    def get(self, ref: tuple[Handle, str, tuple[Any, ...]], timeout: float | None = None) -> Any:
        handle, method, args = ref
        self.calls.append((method, threading.current_thread().name))
        if method == "set_policy":
            if handle.refuse_policy:
                raise RuntimeError("no llm class names model 'large'")  # as a RayTaskError reads
            return None
        if method == "ready":
            return {"models": ["small"], "device": "cpu"}
        return {"device": "cpu", "models": ["small"], "base_s": 0.02, "row_s": 0.001, "prompt_token_s": 0.001,
                "free_kv_tokens": 1 << 20, "block_size": 16, "queued": {}, "running": {}, "failing": handle.failing}


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    ray = FakeRay(["N1"])
    monkeypatch.setattr(membership_module, "ray", ray)
    monkeypatch.setattr(membership_module, "NodeAffinitySchedulingStrategy", lambda *a, **k: None)
    return ray


def members_of(holder: PolicyHolder) -> Membership:
    members = Membership(holder, GatewayConfig(), lambda _rid: None)
    members.refresh()
    members.refresh()  # loaded, then its first load poll makes it ready
    return members


def test_a_replica_whose_policy_swap_failed_is_logged_and_takes_no_request(
        fake_ray: FakeRay, caplog: pytest.LogCaptureFixture) -> None:
    """``set_policy`` raised on the replica and nobody looked: it went on serving the old policy unseen."""
    holder = PolicyHolder(policy())
    members = members_of(holder)
    assert [r.ready for r in members.loads()] == [True]
    members.handle("N1").refuse_policy = True
    holder.swap(policy({"replicas": {"small": 1}}))
    assert not any(m == "set_policy" for m, _ in fake_ray.calls)  # whoever swapped did not wait for it
    members.refresh()
    assert ("set_policy", threading.current_thread().name) in fake_ray.calls  # the poll checked it
    assert [r.ready for r in members.loads()] == [False]
    assert "kept its old policy" in caplog.text and members.nodes()[0]["error"].startswith("policy swap failed")
    router = Router(["voice"])
    with pytest.raises(LookupError):
        router.place("voice", "small", 10, [], members.loads())
    members.handle("N1").refuse_policy = False
    holder.swap(policy())
    members.refresh()
    assert [r.ready for r in members.loads()] == [True] and members.nodes()[0]["error"] is None


# ---- finding 2: a replica whose engine keeps failing -------------------------------------------------

def test_gateway_load_publishes_a_failing_engine() -> None:
    for failing in (False, True):
        gw = types.SimpleNamespace(loop=None, llms={}, pool=None, device="cpu",
                                   engine_health=lambda f=failing: {"failing": f, "last_error": None, "errors": []})
        assert gateway_load(gw)["failing"] is failing  # type: ignore[arg-type]


def test_membership_passes_a_failing_engine_to_the_router(fake_ray: FakeRay) -> None:
    members = members_of(PolicyHolder(policy()))
    members.handle("N1").failing = True
    members.refresh()
    assert [r.failing for r in members.loads()] == [True]


def test_the_router_places_on_a_failing_replica_only_when_no_other_serves_the_model() -> None:
    """Its requests ended at once, so it looked the idlest replica and drew the traffic."""
    router = Router(["voice"])
    for _ in range(3):
        router.dispatched("busy", "voice", 40, [])
        router.dispatched("busy", "summarize", 40, [])
    busy, failing = ReplicaLoad("busy", models=("m",)), ReplicaLoad("failing", models=("m",), failing=True)
    for class_name in ("voice", "summarize"):
        assert router.place(class_name, "m", 40, [], [failing, busy]).replica_id == "busy"
        assert router.place(class_name, "m", 40, [], [failing]).replica_id == "failing"


# ---- finding 3: the standby node that leaves ----------------------------------------------------------

class WatchedLock:
    """A lock that says whether it is held."""

    def __init__(self) -> None:
        self._lock, self.held = threading.Lock(), False

    def __enter__(self) -> WatchedLock:
        self._lock.acquire()
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.held = False
        self._lock.release()


class Replicas(dict[str, Any]):
    """The membership's replicas, checking that an entry leaves under the lock (``loads`` iterates them
    on the event loop: "dictionary changed size during iteration")."""

    lock: WatchedLock

    def __delitem__(self, key: str) -> None:
        assert self.lock.held, f"replica {key} removed without the membership lock"
        super().__delitem__(key)


def test_a_standby_node_that_leaves_is_removed_under_the_lock(fake_ray: FakeRay) -> None:
    fake_ray.node_names = ["N1", "N2"]
    members = Membership(PolicyHolder(policy({"replicas": {"small": 1, "large": 1}})), GatewayConfig(),
                         lambda _rid: None)
    lock = WatchedLock()
    members._lock = lock  # type: ignore[assignment]
    members.replicas = Replicas()
    members.replicas.lock = lock
    members.refresh()
    assert members.replicas["N2"].state == "standby"
    fake_ray.node_names = ["N1"]
    members.refresh()
    assert "N2" not in members.replicas


def test_a_node_back_under_a_new_id_replaces_the_entry_it_left(fake_ray: FakeRay) -> None:
    """Found by a review: every restart or dropped link of a node (a new Ray node id each time) left one
    more "left" entry in membership for good: its actor handle and load, and one more row in `homeai nodes`,
    /v1/stats and the TUI."""
    members = members_of(PolicyHolder(policy()))
    for restart in range(1, 4):
        fake_ray.nodes = lambda r=restart: [  # type: ignore[method-assign]
            {"NodeID": f"N1-{r}", "Alive": True, "Resources": {"homeai_device": 1.0}, "Labels": {"homeai-node": "N1"}}]
        members.refresh()
        members.refresh()
    assert [(r["replica"], r["state"]) for r in members.nodes()] == [("N1-3", "ready")], members.nodes()
