"""A replica whose actor died is placed again on the same node under the same replica id. A stream of the
dead actor, read late by a slow client, then raised its RayActorError and marked the new replica left too:
it was killed, its router counts forgotten, and every request streaming on it cut. ``lost`` now names the
actor the stream was from, and a stale one is ignored. Ray is stubbed: no cluster starts."""

from __future__ import annotations

import itertools
import types
from typing import Any

import pytest
import yaml

import homeai.cluster.membership as membership_module
from homeai.cluster.membership import Membership
from homeai.gateway.gateway import GatewayConfig
from homeai.policy.loader import parse_policy
from homeai.policy.store import PolicyHolder


class ActorDied(Exception):
    pass


class Handle:
    """An actor handle whose method calls return (handle, method) as their object refs."""

    ids = itertools.count(1)

    def __init__(self) -> None:
        self.id, self.dead = next(self.ids), False

    def __getattr__(self, name: str) -> Any:
        return types.SimpleNamespace(remote=lambda *args: (self, name))


def fake_ray(killed: list[Handle]) -> Any:
    def get(ref: tuple[Handle, str], timeout: float | None = None) -> dict[str, Any]:
        handle, name = ref
        if handle.dead:
            raise ActorDied(f"actor {handle.id} died")
        if name == "ready":
            return {"models": ["m"], "device": "cpu"}
        return {"device": "cpu", "models": ["m"], "base_s": 0.02, "row_s": 0.001, "prompt_token_s": 0.001,
                "free_kv_tokens": 1 << 20, "block_size": 16, "queued": {}, "running": {}}

    actor_class = types.SimpleNamespace(options=lambda **kw: actor_class, remote=lambda *a: Handle())
    return types.SimpleNamespace(
        nodes=lambda: [{"NodeID": "N1", "Alive": True, "Resources": {"homeai_device": 1.0},
                        "Labels": {"homeai-node": "gaming-pc"}}],
        remote=lambda cls: actor_class, kill=lambda handle, no_restart=True: killed.append(handle),
        wait=lambda refs, timeout=0: (refs, []), get=get,
        exceptions=types.SimpleNamespace(GetTimeoutError=TimeoutError, ActorUnavailableError=KeyError,
                                         RayActorError=ActorDied))


def test_a_late_error_from_a_dead_actors_stream_leaves_its_successor_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[Handle] = []
    monkeypatch.setattr(membership_module, "ray", fake_ray(killed))
    monkeypatch.setattr(membership_module, "NodeAffinitySchedulingStrategy", lambda *a, **k: None)
    forgotten: list[str] = []
    policy = parse_policy(yaml.safe_dump({"classes": {"chat": {"kind": "llm", "model": "m"}}}), source="test")
    members = Membership(PolicyHolder(policy), GatewayConfig(), forgotten.append)
    members.refresh()
    members.refresh()
    old = members.handle("N1")
    assert old is not None
    old.dead = True  # the actor crashes; the node stays up
    members.refresh()  # its load poll finds it gone
    assert members.replicas["N1"].state == "left"
    members.refresh()
    members.refresh()  # placed again on the same node, under the same replica id
    new = members.handle("N1")
    assert new is not None and new is not old
    members.lost("N1", "replica died", old)  # the old actor's stream, read late
    assert members.replicas["N1"].state == "ready" and members.handle("N1") is new
    assert killed == [old] and forgotten == ["N1"]
    members.lost("N1", "replica died", new)  # the new one's own stream still counts
    assert members.replicas["N1"].state == "left" and killed == [old, new]
