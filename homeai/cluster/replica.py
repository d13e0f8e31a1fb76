"""An engine replica: one device's gateway (its LLMs, KV caches, class schedulers, batcher and device loop,
as on a single box) inside a Ray actor on the node that owns the device.

Only requests, token deltas, aborts and load snapshots cross the network: ``generate`` is a Ray streaming
generator that yields each step's delta as it comes, and the caller cancelling it (a client that left, a
front door that gave up) closes the engine stream, which aborts the sequence. A refusal the front door must
act on (a full queue, a bad request) comes back as a ``Refusal`` item instead of a remote exception, so the
front door can try another replica or answer the client in its API's terms.

The class is plain Python; ``membership`` makes it an actor with ``ray.remote`` when it places one.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from homeai.core.types import SamplingParams, TokenDelta
from homeai.engine.errors import (
    ModelCapacityError,
    ModelLoadError,
    ModelUnloadedError,
    QueueTimeoutError,
    RequestError,
)
from homeai.gateway.gateway import Gateway, GatewayConfig, Route
from homeai.policy.schema import Policy
from homeai.policy.store import PolicyHolder
from homeai.scheduling.class_queue import QueueFullError
from homeai.scheduling.class_scheduler import ClassScheduler

log = logging.getLogger(__name__)


MODEL_RETRY_AFTER_S = 5.0  # a model that cannot be loaded on a replica now: when the client may ask again

@dataclass(slots=True)
class Refusal:
    """The replica did not take the request: ``kind`` is "full" (its class queue: placed elsewhere, or 429),
    "timeout" (its queue timeout passed there: 503), "invalid" (400) or "unavailable" (the model cannot be
    loaded there now: placed elsewhere, or 503). The front door also notes a replica lost before the first
    token as "lost" (placed elsewhere, or 503), and one whose engine failed the request before it as
    "failed" (placed elsewhere, or the engine's error)."""

    kind: str
    message: str
    retry_after_s: float = 1.0


@dataclass(slots=True)
class ReplicaRequest:
    request_id: str
    model: str
    class_name: str
    prompt_ids: list[int]
    params: SamplingParams
    user: str
    priority_level: int | None = None
    timeout_us: int | None = None
    kind: str = "completion"


def llm_only(policy: Policy, models: list[str] | None) -> Policy:
    """The policy a replica runs: its LLM classes (embeddings stay at the front door), on ``models`` if named.
    Without the ``cluster`` section: only the front door places replicas, and its entries name models this
    subset may not serve (the policy's cross-check refused it, and the replica did not start)."""
    keep = {name for name, cp in policy.classes.items()
            if cp.kind == "llm" and (not models or cp.model in models)}
    data = policy.model_dump(by_alias=True, exclude_none=True)
    data.pop("cluster", None)
    data["classes"] = {k: v for k, v in data["classes"].items() if k in keep}
    served = {data["classes"][k]["model"] for k in keep}
    data["models"] = {k: v for k, v in data.get("models", {}).items() if k in served}
    data["aliases"] = {k: v for k, v in data.get("aliases", {}).items() if v.get("class") in keep}
    for user in data.get("users", {}).values():
        if user.get("default_class") not in keep:
            user.pop("default_class", None)
        user["allowed_classes"] = [c for c in user.get("allowed_classes", ["*"]) if c == "*" or c in keep] or ["*"]
    return Policy.model_validate(data)


class EngineReplica:
    """A device's gateway behind a Ray actor handle."""

    def __init__(self, policy: Policy, config: GatewayConfig, models: list[str] | None = None,
                 name: str = "") -> None:
        self.name = name or socket.gethostname()
        self.models = models
        self.started_s = time.time()
        self.gateway = Gateway(PolicyHolder(llm_only(policy, models)), config)
        self.gateway.start()
        log.info("replica %s ready on %s (pid %d): %s", self.name, self.gateway.device, os.getpid(),
                 sorted(self.gateway.llms))

    def ready(self) -> dict[str, Any]:
        return {"name": self.name, "device": str(self.gateway.device), "models": sorted(self.gateway.llms)}

    def set_policy(self, policy: Policy) -> None:
        self.gateway.policy_holder.swap(llm_only(policy, self.models))

    async def generate(self, req: ReplicaRequest) -> AsyncGenerator[TokenDelta | Refusal, None]:
        """The request's deltas as each step makes them (a Ray streaming generator)."""
        route = Route(req.model, req.class_name)
        try:
            await self.gateway.ensure_llm(req.model, req.timeout_us / 1e6 if req.timeout_us else None,
                                          req.class_name)
            stream = self.gateway.generate(route, req.prompt_ids, req.params, req.user, req.request_id,
                                           req.priority_level, req.timeout_us, req.kind)
        except QueueFullError as exc:
            yield Refusal("full", str(exc), exc.retry_after_s)
            return
        except QueueTimeoutError as exc:
            yield Refusal("timeout", str(exc))
            return
        except (RequestError, LookupError) as exc:
            yield Refusal("invalid", str(exc))
            return
        except (ModelCapacityError, ModelLoadError, ModelUnloadedError) as exc:  # another replica may have it
            yield Refusal("unavailable", str(exc), MODEL_RETRY_AFTER_S)
            return
        try:
            async for delta in stream:
                yield delta
        except QueueFullError as exc:  # raised where the first delta is awaited
            yield Refusal("full", str(exc), exc.retry_after_s)
        except RequestError as exc:
            yield Refusal("invalid", str(exc))
        except (ModelCapacityError, ModelLoadError, ModelUnloadedError) as exc:  # before its first delta
            yield Refusal("unavailable", str(exc), MODEL_RETRY_AFTER_S)
        finally:
            await stream.aclose()

    def load(self, counters: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
        """The load the router reads; ``counters``: the cluster's VTC counters, which the engines take."""
        for engine in self.gateway.llms.values():
            if counters:
                engine.share_counters(counters)
        return gateway_load(self.gateway)

    def shutdown(self) -> None:
        self.gateway.shutdown()


def gateway_load(gateway: Gateway) -> dict[str, Any]:
    """What the router reads of a gateway: the fitted step cost, free KV and the queues (as its device
    thread last published them; never read across threads), and whether its engine keeps failing (its
    requests end at once, so it would look idle and draw traffic)."""
    snap = Gateway.snapshot(gateway)  # the device's own, not a cluster's
    classes = snap.get("classes", {})
    # The LLMs it serves, loaded or not (an on-demand one loads when a request comes: advertising only the
    # loaded ones left a model that had left by keep_alive never routed there again), and those loaded now.
    served = {*gateway.llms, *(gateway.pool.models if gateway.pool is not None else {})}
    out: dict[str, Any] = {"device": str(gateway.device), "models": sorted(served), "loaded": sorted(gateway.llms),
                           "failing": bool(gateway.engine_health()["failing"]),
                           "queued": {c: s.get("queued", 0) for c, s in classes.items()},
                           "running": {c: s.get("running", 0) for c, s in classes.items()},
                           "free_kv_tokens": 0, "block_size": 16, "base_s": 0.02, "row_s": 0.001,
                           "prompt_token_s": 0.001, "per_model": {}, "load_s": {}}
    if gateway.pool is not None:  # how long each model took to load here: what a cold start costs
        out["load_s"] = {name: r.load_s for name, r in gateway.pool.models.items() if r.load_s}
    for name, engine in gateway.llms.items():  # each model's own cost and KV pool (the router reads its own)
        bm = engine.scheduler.block_manager
        own: dict[str, float] = {"free_kv_tokens": int(bm.num_blocks * (1 - bm.usage)) * bm.block_size}
        out["free_kv_tokens"] = max(out["free_kv_tokens"], own["free_kv_tokens"])
        out["block_size"] = bm.block_size
        if isinstance(engine.scheduler, ClassScheduler):
            cost = engine.scheduler.step_cost
            own |= {"base_s": cost.base_s, "row_s": cost.per_token_s,
                    "prompt_token_s": cost.prompt_token_s if cost.prompt_token_s is not None else cost.per_token_s}
            out.update(base_s=cost.base_s, row_s=cost.per_token_s, prompt_token_s=cost.prompt_token_s)
            out["per_model"][name] = own
    return out
