"""The cluster gateway's placement loop on scripted replicas (no Ray): a full queue or a replica lost
before the first token moves the request to another replica; a replica lost after it ends the stream with
an error naming the node; a queue timeout there is a 503, not a second wait; with no replica left the
client gets the refusal."""

from __future__ import annotations

import asyncio
import pickle
from collections import Counter
from collections.abc import AsyncGenerator
from typing import Any

import pytest
import yaml

from homeai.cluster.cluster_gateway import ClusterGateway, ReplicaLostError
from homeai.cluster.replica import Refusal, ReplicaRequest
from homeai.cluster.router import ReplicaLoad
from homeai.core.types import FinishReason, SamplingParams, TokenDelta
from homeai.engine.errors import (
    REPLICA_LOST,
    ModelCapacityError,
    ModelLoadError,
    ModelUnloadedError,
    QueueTimeoutError,
    RequestError,
)
from homeai.policy.loader import parse_policy
from homeai.policy.store import PolicyHolder
from homeai.scheduling.class_queue import QueueFullError

POLICY = {"classes": {"voice": {"kind": "llm", "model": "m", "priority": 0}}}
TOKENS, LOST, FAILED = "tokens", "lost", "failed"


def gateway(scripts: dict[str, list[Any]]) -> ClusterGateway:
    """Replicas "a" and "b"; each placement on a replica plays its next script entry: "tokens" (a full
    answer), "lost" (the actor dies before a token), ("lost after", n) (it dies after n tokens), "failed"
    (its engine fails the request before a token: an error delta), or a Refusal."""
    gw = ClusterGateway(PolicyHolder(parse_policy(yaml.safe_dump(POLICY), source="test")), serve_locally=False)
    gw.router.set_interactive(["voice"])
    loads = [ReplicaLoad(rid, node=rid, models=("m",)) for rid in scripts]
    gw.replica_loads = lambda: list(loads)  # type: ignore[method-assign]

    async def stream_from(rid: str, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        entry = scripts[rid].pop(0)
        if isinstance(entry, Refusal):
            yield entry
            return
        if entry == LOST:
            raise ReplicaLostError("ActorDiedError")
        if entry == FAILED:
            yield TokenDelta(req.request_id, "", [], 3, 0, finish_reason=FinishReason.ABORT,
                             error="engine error: CUDA error")
            return
        n = entry[1] if isinstance(entry, tuple) else 3
        for i in range(n):
            yield TokenDelta(req.request_id, f"t{i}", [i], 3, i + 1,
                             finish_reason="length" if entry == TOKENS and i == n - 1 else None)
        if isinstance(entry, tuple):
            raise ReplicaLostError("NodeDiedError")

    gw._stream_from = stream_from  # type: ignore[method-assign]
    gw._name = lambda rid: rid  # type: ignore[method-assign]
    return gw


def run(gw: ClusterGateway) -> list[TokenDelta]:
    req = ReplicaRequest("r1", "m", "voice", [1, 2, 3], SamplingParams(max_tokens=3), "alice")

    async def collect() -> list[TokenDelta]:
        return [d async for d in gw._placed(req)]

    return asyncio.run(collect())


def test_a_replica_lost_before_the_first_token_is_replaced_by_another() -> None:
    gw = gateway({"a": [LOST], "b": [TOKENS]})
    deltas = run(gw)
    assert deltas[-1].finish_reason == "length" and "".join(d.text for d in deltas) == "t0t1t2"
    assert gw.served_by["r1"] == "b" and gw.outcomes["b", "served"] == 1


def test_a_replica_lost_mid_stream_ends_it_with_an_error_naming_the_node() -> None:
    gw = gateway({"a": [("lost after", 2)], "b": [("lost after", 2)]})
    deltas = run(gw)
    last = deltas[-1]
    assert last.error is not None and last.error.startswith(REPLICA_LOST) and last.num_output_tokens == 2
    assert f"node {gw.served_by['r1']} " in last.error
    assert sum(gw.outcomes[rid, "failed"] for rid in ("a", "b")) == 1  # not placed again: it had streamed


def test_a_full_queue_moves_the_request_and_all_full_is_429() -> None:
    full = Refusal("full", "queue full", 2.0)
    assert run(gateway({"a": [full], "b": [TOKENS]}))[-1].finish_reason == "length"
    with pytest.raises(QueueFullError) as exc:
        run(gateway({"a": [full], "b": [full]}))
    assert exc.value.retry_after_s == 2.0


def test_a_queue_timeout_there_is_503_and_a_bad_request_400() -> None:
    with pytest.raises(QueueTimeoutError):
        run(gateway({"a": [Refusal("timeout", "waited 5 s")], "b": [TOKENS]}))
    with pytest.raises(RequestError):
        run(gateway({"a": [Refusal("invalid", "unknown class")], "b": [TOKENS]}))


def test_every_replica_lost_before_a_token_is_503() -> None:
    with pytest.raises(QueueTimeoutError, match="no replica could take"):
        run(gateway({"a": [LOST], "b": [LOST]}))


def test_the_router_forgets_nothing_it_counted() -> None:
    """Placements end in the router's books whatever happened, so a replica's load does not drift."""
    gw = gateway({"a": [LOST], "b": [("lost after", 1)]})
    run(gw)
    assert all(not any(gw.router.placed_live(rid).values()) for rid in ("a", "b"))


def test_a_class_queue_limit_holds_across_the_cluster() -> None:
    """voice holds 2 waiting requests in all: two replicas each publishing one queued refuse a third."""
    doc = {"classes": {"voice": {"kind": "llm", "model": "m", "priority": 0,
                                 "default_queue_policy": {"max_queue_size": 2}}}}
    gw = gateway({"a": [TOKENS], "b": [TOKENS]})
    gw.policy_holder.swap(parse_policy(yaml.safe_dump(doc), source="test"))
    busy = [ReplicaLoad(rid, node=rid, models=("m",), queued={"voice": 1}) for rid in ("a", "b")]
    gw.replica_loads = lambda: list(busy)  # type: ignore[method-assign]
    with pytest.raises(QueueFullError):
        run(gw)
    busy[1].queued = {"voice": 0}
    assert run(gw)[-1].finish_reason == "length"


def test_one_user_filling_the_cluster_queue_does_not_refuse_everyone_else() -> None:
    """As on one box (push-out): with voice's queues full of one key's requests, another member of the
    household is still placed; the key that holds the most is refused, and at twice the limit everyone is.
    The front door's count of waiting requests drops to nothing as each placement ends, however it ends."""
    doc = {"classes": {"voice": {"kind": "llm", "model": "m", "priority": 0,
                                 "default_queue_policy": {"max_queue_size": 2}}}}
    gw = gateway({"a": [TOKENS, LOST], "b": [TOKENS, TOKENS]})
    gw.policy_holder.swap(parse_policy(yaml.safe_dump(doc), source="test"))
    busy = [ReplicaLoad(rid, node=rid, models=("m",), queued={"voice": 1}) for rid in ("a", "b")]
    gw.replica_loads = lambda: list(busy)  # type: ignore[method-assign]
    gw.waiting["voice"] = Counter(mallory=2)  # her two requests wait in those queues

    def run_as(user: str) -> list[TokenDelta]:
        req = ReplicaRequest(f"r-{user}", "m", "voice", [1, 2, 3], SamplingParams(max_tokens=3), user)

        async def collect() -> list[TokenDelta]:
            return [d async for d in gw._placed(req)]

        return asyncio.run(collect())

    assert run_as("bob")[-1].finish_reason == "length"
    with pytest.raises(QueueFullError):
        run_as("mallory")
    assert run_as("carol")[-1].finish_reason == "length"  # "a" lost it before a token: placed on "b"
    assert gw.waiting["voice"] == Counter(mallory=2)  # bob's and carol's placements counted and uncounted
    busy[0].queued = busy[1].queued = {"voice": 2}  # twice the limit
    with pytest.raises(QueueFullError):
        run_as("bob")
    assert gw.waiting["voice"] == Counter(mallory=2)


def test_a_model_a_replica_cannot_load_now_moves_the_request_and_none_is_503() -> None:
    """ModelCapacityError and ModelLoadError there could not even be rebuilt on the front door (their
    two-argument constructors did not pickle): the client got a 500 and no other replica was tried."""
    for exc in (ModelCapacityError("m", "m does not fit"), ModelLoadError("m", "m: disk on fire"),
                ModelUnloadedError("m", "m was unloaded")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and again.model == "m" and str(again) == str(exc)
    unavailable = Refusal("unavailable", "m does not fit", 5.0)
    gw = gateway({"a": [unavailable], "b": [TOKENS]})
    assert run(gw)[-1].finish_reason == "length" and gw.served_by["r1"] == "b"
    with pytest.raises(QueueTimeoutError, match="no replica could take the request: m does not fit"):
        run(gateway({"a": [unavailable], "b": [unavailable]}))


def test_the_shared_fairness_counter_charges_as_a_single_box_does() -> None:
    """The front door charged the whole prompt at the first delta: a cached prefix too (what prefix
    affinity arranges for a household's long system prompt), and a request that timed out in its queue."""
    charged: list[tuple[int, int]] = []
    gw = gateway({"a": [TOKENS, TOKENS]})
    gw._charge = lambda req, i, o: charged.append((i, o))  # type: ignore[method-assign]
    script = gw._stream_from

    async def cached(rid: str, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        async for item in script(rid, req):
            if isinstance(item, TokenDelta):
                item.num_cached_tokens = 2  # 2 of the 3 prompt tokens came from the prefix cache
            yield item

    gw._stream_from = cached  # type: ignore[method-assign]
    run(gw)
    assert charged[0] == (1, 0) and sum(o for _, o in charged) == 3

    charged.clear()

    async def timed_out(rid: str, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        yield TokenDelta(req.request_id, "", [], 3, 0, finish_reason="abort", error="queue timeout", timed_out=True)

    gw._stream_from = timed_out  # type: ignore[method-assign]
    run(gw)
    assert charged == []


def test_at_the_drain_deadline_a_remote_stream_ends_with_the_shutdown_error() -> None:
    """The deadline's fail-all reached the engines loaded here only: a stream from a node's replica went
    on until uvicorn cut it with no final message, and a request still waiting to be placed was sent."""
    from homeai.api.drain import SHUTDOWN_MESSAGE, end_open_generations
    from homeai.engine.errors import ShuttingDownError

    gw = gateway({"a": [("lost after", 5)], "b": [TOKENS]})
    req = ReplicaRequest("r1", "m", "voice", [1, 2, 3], SamplingParams(max_tokens=5), "alice")

    async def two_tokens_then_the_deadline() -> list[TokenDelta]:
        out = []
        async for delta in gw._placed(req):
            out.append(delta)
            if len(out) == 2:
                end_open_generations(gw)
        return out

    deltas = asyncio.run(two_tokens_then_the_deadline())
    assert [d.text for d in deltas[:2]] == ["t0", "t1"] and len(deltas) == 3
    assert deltas[-1].error == SHUTDOWN_MESSAGE and deltas[-1].num_output_tokens == 2
    with pytest.raises(ShuttingDownError):
        run(gw)


def test_an_engine_error_before_the_first_token_moves_the_request() -> None:
    """A node whose device kept failing answered each request with an error delta at once: the client got a
    500 although nothing was streamed, and the node, always idle, drew the next request too."""
    gw = gateway({"a": [FAILED], "b": [TOKENS]})
    deltas = run(gw)
    assert deltas[-1].finish_reason == "length" and all(d.error is None for d in deltas)
    assert gw.served_by["r1"] == "b" and gw.outcomes["a", "failed"] == 1 and gw.outcomes["b", "served"] == 1
    assert all(not any(gw.router.placed_live(rid).values()) for rid in ("a", "b"))


def test_an_engine_error_on_every_replica_reaches_the_client_once() -> None:
    """Each replica is tried once; the last one's error is the answer, as a single box gives it."""
    gw = gateway({"a": [FAILED], "b": [FAILED]})
    deltas = run(gw)
    assert len(deltas) == 1 and deltas[0].error == "engine error: CUDA error"
    assert gw.outcomes["a", "failed"] == 1 and gw.outcomes["b", "failed"] == 1


def test_a_queue_timeout_delta_is_the_answer_not_placed_again() -> None:
    gw = gateway({"a": [TOKENS], "b": [TOKENS]})

    async def timed_out(rid: str, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        yield TokenDelta(req.request_id, "", [], 3, 0, finish_reason=FinishReason.ABORT, error="queue timeout",
                         timed_out=True)

    gw._stream_from = timed_out  # type: ignore[method-assign]
    deltas = run(gw)
    assert len(deltas) == 1 and deltas[0].timed_out and len(gw.served_by) == 1


class Pool:
    """The model pool's leases, counted; ``models``: the LLMs it may load."""

    def __init__(self) -> None:
        self.models = {"m": object()}
        self.leases = 0

    def lease(self, name: str) -> None:
        self.leases += 1

    def release(self, name: str) -> None:
        self.leases -= 1


def test_the_front_doors_model_is_leased_while_a_node_serves_the_request() -> None:
    """The front door detokenizes the answer with its own copy of the model: keep_alive unloaded it while a
    node streamed, and the answer's end could not be read."""
    gw = gateway({"a": [TOKENS], "b": [TOKENS]})
    gw.pool = Pool()  # type: ignore[assignment]
    script, seen = gw._stream_from, []

    async def watched(rid: str, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        async for item in script(rid, req):
            seen.append(gw.pool.leases)  # type: ignore[union-attr]
            yield item

    gw._stream_from = watched  # type: ignore[method-assign]
    run(gw)
    assert seen and all(n == 1 for n in seen) and gw.pool.leases == 0  # type: ignore[union-attr]

    gw = gateway({"a": [TOKENS], "b": [TOKENS]})
    gw.pool = Pool()  # type: ignore[assignment]
    req = ReplicaRequest("r2", "m", "voice", [1, 2, 3], SamplingParams(max_tokens=3), "alice")

    async def leave_after_one() -> None:
        stream = gw._placed(req)
        await anext(stream)
        await stream.aclose()  # the client left

    asyncio.run(leave_after_one())
    assert gw.pool.leases == 0  # type: ignore[union-attr]


def test_placed_again_on_the_front_door_its_model_is_loaded_if_it_left() -> None:
    """A request placed on the front door's device after a node lost it asked ``llm`` for an engine: a model
    keep_alive had unloaded meanwhile was a 503 ("not loaded") instead of loaded again."""

    class Engine:
        def generate(self, *args: Any) -> AsyncGenerator[TokenDelta, None]:
            async def deltas() -> AsyncGenerator[TokenDelta, None]:
                yield TokenDelta("r1", "hi", [7], 3, 1, finish_reason=FinishReason.STOP)
            return deltas()

    gw = ClusterGateway(PolicyHolder(parse_policy(yaml.safe_dump(POLICY), source="test")))
    gw.pool = Pool()  # type: ignore[assignment]
    loaded: list[str] = []

    async def ensure_llm(model: str, timeout_s: float | None = None, class_name: str = "",
                         max_waiting: int = 0) -> Any:
        loaded.append(model)
        return Engine()

    gw.ensure_llm = ensure_llm  # type: ignore[method-assign]
    req = ReplicaRequest("r1", "m", "voice", [1, 2, 3], SamplingParams(max_tokens=3), "alice")

    async def collect() -> list[TokenDelta | Refusal]:
        return [d async for d in gw._stream_from("local", req)]

    out = asyncio.run(collect())
    assert loaded == ["m"] and isinstance(out[-1], TokenDelta) and out[-1].finish_reason == "stop"

    async def cannot_fit(model: str, timeout_s: float | None = None, class_name: str = "",
                         max_waiting: int = 0) -> Any:
        raise ModelCapacityError(model, "m does not fit")

    gw.ensure_llm = cannot_fit  # type: ignore[method-assign]
    out = asyncio.run(collect())
    assert isinstance(out[-1], Refusal) and out[-1].kind == "unavailable"  # another replica may take it


class SilentStream:
    """A node's stream that sends nothing (queued there, in a long prompt step, behind a model's load) until
    Ray cancels it, when its reader raises as Ray's does."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()


def test_at_the_drain_deadline_a_remote_stream_waiting_for_its_first_delta_ends_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: the deadline's check ran only when a delta came, so a request waiting on a node (no
    delta yet) was cut by uvicorn with no final message, and the node went on with it."""
    from homeai.api.drain import SHUTDOWN_MESSAGE, end_open_generations
    from homeai.cluster import cluster_gateway

    gw = gateway({"a": [TOKENS]})
    silent = SilentStream()
    monkeypatch.setattr(cluster_gateway.ray, "cancel", lambda gen: gen.cancelled.set())

    async def waits(rid: str, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        gw.remote_streams.add(silent)
        try:
            await silent.cancelled.wait()
            raise ReplicaLostError("TaskCancelledError")
            yield  # an async generator
        finally:
            gw.remote_streams.discard(silent)

    gw._stream_from = waits  # type: ignore[method-assign]
    req = ReplicaRequest("r1", "m", "voice", [1, 2, 3], SamplingParams(max_tokens=5), "alice")

    async def deadline_while_waiting() -> list[TokenDelta]:
        answer = asyncio.ensure_future(_collect(gw, req))
        await asyncio.sleep(0.01)
        assert not answer.done()  # waiting on the node
        end_open_generations(gw)
        return await asyncio.wait_for(answer, 5)

    deltas = asyncio.run(deadline_while_waiting())
    assert len(deltas) == 1 and deltas[0].error == SHUTDOWN_MESSAGE and not gw.remote_streams


async def _collect(gw: ClusterGateway, req: ReplicaRequest) -> list[TokenDelta]:
    return [d async for d in gw._placed(req)]
