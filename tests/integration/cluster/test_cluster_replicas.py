"""A local Ray cluster of three nodes on loopback (Ray's ``Cluster``): the head, where the front door's
driver connects, and two nodes ("nas", "gaming-pc"), each with a real SmolLM2 replica. The front door is a
``ClusterGateway`` that serves nothing itself, so every request crosses to a replica.

The tests share the cluster and run in order: routing by class and prefix, a weights' ratio across the two
replicas, then a node killed mid-stream (nothing lost), then a node that joins again and is used again.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from homeai.cluster.cluster_gateway import ClusterGateway
from homeai.cluster.node_spec import NAME_LABEL, node_resources
from homeai.core.types import SamplingParams
from homeai.gateway.gateway import GatewayConfig, Route
from homeai.policy.loader import load_policy
from homeai.policy.schema import Policy
from homeai.policy.store import PolicyHolder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[3]
NODES = ("nas", "gaming-pc")


def _policy() -> Policy:
    """The default policy, with chat running one request at a time on each replica: its queue then holds
    the rest, and the users' weights (alice 2, bob 1) decide the order."""
    data = load_policy(REPO / "policies" / "default.yaml").model_dump(by_alias=True, exclude_none=True)
    data["classes"]["chat"]["max_running"] = 1
    data["users"]["bob"] = {"weight": 1.0}
    return Policy.model_validate(data)


def _add_node(cluster: Cluster, name: str) -> Any:
    return cluster.add_node(num_cpus=1, resources=node_resources("cpu", []), labels={NAME_LABEL: name})


@pytest.fixture(scope="module")
def cluster(pulled_models: dict[str, Path], homeai_cache_dir: Path) -> Any:
    # The nodes' processes inherit these (they start now): the pulled models, and one thread per engine as
    # two engines share this machine's cores. Restored after, so no later test runs with them.
    saved = {k: os.environ.get(k) for k in ("HOMEAI_CACHE_DIR", "HOMEAI_CPU_THREADS")}
    os.environ.update(HOMEAI_CACHE_DIR=str(homeai_cache_dir), HOMEAI_CPU_THREADS="1")
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        nodes = {name: _add_node(c, name) for name in NODES}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    ray.init(address=c.address, namespace="homeai", log_to_driver=False)
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def _ready(gateway: ClusterGateway, names: set[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if {load.node for load in gateway.replica_loads()} >= names:
            return
        time.sleep(0.2)
    raise AssertionError(f"replicas {names} not ready; nodes: {gateway.snapshot()['cluster']['nodes']}")


@pytest.fixture(scope="module")
def gateway(cluster: Any, homeai_cache_dir: Path) -> Any:
    g = ClusterGateway(PolicyHolder(_policy()), GatewayConfig(cache_dir=homeai_cache_dir), serve_locally=False)
    g.start()
    try:
        _ready(g, set(NODES))
        yield g
    finally:
        g.shutdown()


@dataclass
class Outcome:
    request_id: str = ""
    text: str = ""
    tokens: int = 0
    first_s: float | None = None
    finish: str | None = None
    error: str | None = None
    token_times: list[float] = field(default_factory=list)


async def _run(g: ClusterGateway, class_name: str, content: str, max_tokens: int, user: str = "default",
               started: asyncio.Event | None = None, out: Outcome | None = None) -> Outcome:
    """One request's stream, recorded in ``out`` (a fresh Outcome by default) as it comes."""
    ids = g.chat_prompt(MODEL, [{"role": "user", "content": content}])
    out, t0 = out or Outcome(), time.monotonic()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    async for d in g.generate(Route(MODEL, class_name), ids, params, user):
        out.request_id = d.request_id
        if d.token_ids:
            out.tokens += len(d.token_ids)
            out.token_times.append(time.monotonic() - t0)
            if out.first_s is None:
                out.first_s = out.token_times[-1]
                if started is not None:
                    started.set()
        out.text += d.text
        out.finish, out.error = d.finish_reason or out.finish, d.error or out.error
    return out


def test_voice_goes_to_the_idle_replica_while_background_runs_on_the_other(gateway: ClusterGateway) -> None:
    async def scenario() -> tuple[Outcome, Outcome]:
        started = asyncio.Event()
        summary = asyncio.create_task(_run(gateway, "summarize", "Summarize: " + "the house is quiet. " * 60,
                                           96, started=started))
        await started.wait()
        voice = await _run(gateway, "voice", "Turn on the kitchen light", 8)
        return await summary, voice

    summary, voice = asyncio.run(scenario())
    assert summary.finish == "length" and voice.finish == "length"
    assert gateway.served_by[voice.request_id] != gateway.served_by[summary.request_id]


def test_a_repeated_system_prompt_goes_to_the_replica_holding_its_prefix(gateway: ClusterGateway) -> None:
    system = "You are the kitchen assistant of the Miller household. " * 12

    async def turns() -> list[Outcome]:
        return [await _run(gateway, "voice", f"{system} Question {i}: what time is it?", 4) for i in range(3)]

    outcomes = asyncio.run(turns())
    assert all(o.finish == "length" for o in outcomes)
    assert len({gateway.served_by[o.request_id] for o in outcomes}) == 1


def test_weights_hold_across_two_replicas(gateway: ClusterGateway) -> None:
    """alice (weight 2) and bob (weight 1) each keep three chats waiting for 10 s: chat runs one at a time
    on each replica, so the queues decide, ordered by the one VTC counter the replicas share; alice gets
    about twice bob's chats (equal shares, as a FIFO or per-user replicas would give, are 1:1)."""
    done: Counter[str] = Counter()

    async def keep_busy(user: str, until: float) -> None:
        while time.monotonic() < until:
            o = await _run(gateway, "chat", f"Tell {user} a story", 16, user=user)
            assert o.finish == "length", o
            if time.monotonic() < until:
                done[user] += 1

    async def race() -> None:
        until = time.monotonic() + 10.0
        await asyncio.gather(*(keep_busy(u, until) for u in ["alice", "bob"] * 3))

    asyncio.run(race())
    assert done["bob"] >= 3 and done["alice"] >= 1.5 * done["bob"], done


def test_a_node_killed_mid_stream_loses_nothing(cluster: Any, gateway: ClusterGateway) -> None:
    """Streams on the killed node that had tokens end with an error naming it; those still waiting for
    their first token are placed again and finish; every request ends."""
    c, nodes = cluster
    _ready(gateway, set(NODES))

    async def scenario() -> list[Outcome]:
        # Background spreads by idle capacity whatever each replica's fitted cost (an interactive request
        # goes to the replica whose fit predicts the sooner first token, which may be the same one each time).
        chats = [Outcome() for _ in range(4)]
        tasks = [asyncio.create_task(_run(gateway, "summarize", f"Count to {n}", 200, user=f"u{n}", out=o))
                 for n, o in enumerate(chats)]
        deadline = time.monotonic() + 60
        while not any(o.tokens and gateway.served_by.get(o.request_id) == "gaming-pc" for o in chats):
            assert time.monotonic() < deadline, ("nothing streamed from gaming-pc", gateway.snapshot()["cluster"])
            await asyncio.sleep(0.05)
        late = [asyncio.create_task(_run(gateway, "voice", f"Light {n} on", 8)) for n in range(2)]
        await asyncio.sleep(0.3)
        await asyncio.to_thread(c.remove_node, nodes["gaming-pc"])
        return await asyncio.gather(*tasks, *late)

    outcomes = asyncio.run(scenario())
    assert all(o.finish is not None or o.error is not None for o in outcomes), outcomes  # none lost
    failed = [o for o in outcomes if o.error is not None]
    for o in failed:
        assert o.tokens > 0 and "gaming-pc" in o.error  # only streams that had begun there fail, naming it
    assert all(o.finish == "length" for o in outcomes if o.error is None)
    assert failed, "a summary was streaming from gaming-pc when it left"
    nodes_now = {n["name"]: n for n in gateway.snapshot()["cluster"]["nodes"]}
    assert nodes_now["gaming-pc"]["state"] == "left" and nodes_now["nas"]["state"] == "ready"


def test_a_node_that_joins_again_is_used_again(cluster: Any, gateway: ClusterGateway) -> None:
    c, nodes = cluster
    nodes["gaming-pc"] = _add_node(c, "gaming-pc")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = [n["state"] for n in gateway.snapshot()["cluster"]["nodes"] if n["name"] == "gaming-pc"]
        if "ready" in states:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(gateway.snapshot()["cluster"]["nodes"])

    async def two() -> list[Outcome]:
        return list(await asyncio.gather(*(_run(gateway, "summarize", f"Note {n}", 16) for n in range(4))))

    outcomes = asyncio.run(two())
    assert all(o.finish == "length" for o in outcomes)
    assert {gateway.served_by[o.request_id] for o in outcomes} == {"nas", "gaming-pc"}
