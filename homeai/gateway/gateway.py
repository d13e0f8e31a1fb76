"""The gateway as the API and the jobs see it: models from the repository, the policy, one device loop.

``Gateway.start`` loads the policy's models (each LLM with its own KV cache and class scheduler, the
encoders through the embedding service), wires them to one batcher (the LLMs as one ``ModelSet``, whose
claims decide whose step runs) and one device loop, and follows policy swaps.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from homeai.core.prefix_stats import merged_snapshot
from homeai.core.types import SamplingParams, TokenDelta
from homeai.engine.builder import EngineConfig, build_llm_engine, chat_prompt_ids
from homeai.engine.device_loop import DeviceLoop
from homeai.engine.embed_service import EmbedResult, EmbedService
from homeai.engine.errors import (
    ModelCapacityError,
    ModelLoadError,
    ModelLoadingError,
    ModelUnloadedError,
    QueueTimeoutError,
    RequestError,
    ShuttingDownError,
)
from homeai.engine.llm_engine import LLMEngine
from homeai.gateway.footprint import build_catalog, engine_bytes, free_engine
from homeai.gateway.metering import Meter, Submission
from homeai.gateway.model_pool import ModelPool
from homeai.policy.catalog import ModelCatalog
from homeai.policy.schema import ClassPolicy, Policy
from homeai.policy.store import PolicyHolder
from homeai.repository.cache import default_cache_dir
from homeai.repository.entries import EntryError, ModelEntry, load_entries
from homeai.repository.pull import pull
from homeai.runtime.decode_graph import compile_mode_from_env
from homeai.runtime.device import choose_device, in_passing_thread, process_rss_mb
from homeai.runtime.embedder import Embedder
from homeai.scheduling.batcher import Batcher
from homeai.scheduling.class_queue import QueueFullError
from homeai.scheduling.class_scheduler import ClassScheduler, UnknownClassError
from homeai.scheduling.model_set import ModelSet
from homeai.scheduling.step_budget import CALIBRATION_FILE, load_step_cost

log = logging.getLogger(__name__)
LOAD_RETRY_AFTER_S = 2.0  # Retry-After of a request refused while its model loads (a load takes seconds)


class UnknownModelError(LookupError):
    """No served model or alias has this name (HTTP 404)."""


@dataclass(slots=True)
class GatewayConfig:
    cache_dir: Path | None = None
    models_dir: Path | None = None
    device: str | None = None
    dtype: str | None = None
    kv_cache_mb: int = 256
    max_model_len: int | None = None
    pull_missing: bool = True
    compile_decode: str | None = None  # None: EngineConfig's default (HOMEAI_COMPILE_DECODE, else auto)


@dataclass(slots=True)
class Route:
    """Where a request goes: the served model and its class."""

    model: str
    class_name: str


@dataclass
class Gateway:
    policy_holder: PolicyHolder
    config: GatewayConfig = field(default_factory=GatewayConfig)
    llms: dict[str, LLMEngine] = field(default_factory=dict)
    embedders: dict[str, Embedder] = field(default_factory=dict)
    entries: dict[str, ModelEntry] = field(default_factory=dict)
    batcher: Batcher | None = None
    embed_service: EmbedService | None = None
    loop: DeviceLoop | None = None
    pool: ModelPool | None = None  # which LLMs are on the device, and for how long
    started_s: float = 0.0
    device: Any = None  # the torch device every model is on
    rss_at_ready_mb: float = 0.0  # resident memory once every model is loaded (reported in /v1/stats)
    meter: Meter = field(default_factory=Meter)  # every submission below is recorded here, once
    # requests waiting for their model's load, by (model, class): held to the class's max_queue_size
    loading_waiters: Counter[tuple[str, str]] = field(default_factory=Counter)
    closing: str | None = None  # set at the drain's deadline: no request starts after it (ShuttingDownError)
    _encoder_loads: dict[str, threading.Thread] = field(default_factory=dict)  # embedding models loading now
    _encoder_errors: dict[str, str] = field(default_factory=dict)  # why an embedding model's load failed

    @property
    def policy(self) -> Policy:
        return self.policy_holder.current

    def class_policy(self, class_name: str) -> ClassPolicy:
        """The class's policy now. A request routed to a class that a policy change removed while it awaited
        (a model's load, its tokenizer, its grammar) gets a 400 saying so; it was a 500 (KeyError)."""
        cp = self.policy.classes.get(class_name)
        if cp is None:
            raise UnknownClassError(f"class {class_name!r} was removed by a policy change while the request "
                                    "waited; send it again")
        return cp

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Load the encoders, start the device loop, then the LLMs that load at start (pinned or ``load:
        start``) through the model pool, which loads the others when a request needs them."""
        cfg = self.config
        policy = self.policy
        self.entries = load_entries(cfg.models_dir)
        device = choose_device(cfg.device)
        self.device = device
        emb_models = sorted({c.model for c in policy.classes.values() if c.kind == "embedding"})
        for name in emb_models:
            entry = self._entry(name)
            # In a passing thread, as the LLM builder does: only the device thread keeps an OpenMP pool.
            self.embedders[name] = in_passing_thread(Embedder.load, self._folder(entry), device)
        self.batcher = Batcher(policy, ModelSet())  # the LLMs join it as they load
        self.embed_service = EmbedService(self.batcher, self.embedders, threading.Event())
        self.loop = DeviceLoop(llm=None, batcher=self.batcher, embed=self.embed_service,
                               build_snapshot=self._build_snapshot, encoders_wanted=self._encoders_wanted)
        catalog = self.catalog()
        self.pool = ModelPool(None, self._load_llm, self._attach, self._detach, free_engine, engine_bytes)
        # The device thread owns the scheduling state: a swap is posted to it, never applied from here.
        self.policy_holder.subscribe(lambda p, _v: self._follow(p))
        self.loop.start()
        self.pool.start()
        self.pool.load_now(self._configure_pool(policy, catalog))
        self.started_s = time.time()
        self.rss_at_ready_mb = process_rss_mb()

    def _configure_pool(self, policy: Policy, catalog: ModelCatalog | None) -> list[str]:
        """The pool's budget, the encoders' share of it and the LLMs' estimates, for ``policy``. The encoders
        counted are the ones it names (an encoder it no longer names leaves once the device thread applies it,
        one it adds loads now): counted once at start, a dropped encoder's memory stayed taken and an added
        one's was never counted."""
        assert self.pool is not None
        self.pool.budget_bytes = policy.scheduler.memory_budget_bytes(catalog.device_memory_bytes if catalog else None)
        encoders = sorted({c.model for c in policy.classes.values() if c.kind == "embedding"})
        self.pool.fixed_bytes = sum(catalog.footprint_bytes(policy, n, "embedding") or 0
                                    for n in encoders) if catalog else 0
        estimates = {name: catalog.footprint_bytes(policy, name, "llm") or 0 for name in policy.llm_models()} \
            if catalog else {}
        return self.pool.configure(policy, estimates)

    def _follow(self, policy: Policy) -> None:
        """A policy swap: the device thread takes it before the next iteration; models it names that load
        at start load now (in the background), those it no longer names leave once idle."""
        if self.loop is None or self.pool is None:
            return
        self._follow_encoders(policy)
        self.loop.post_policy(policy)
        for name in self._configure_pool(policy, self.catalog()):
            try:
                self.pool.acquire(name)
            except ModelCapacityError as exc:  # validation checked the fit: a busy model may hold the room
                log.warning("%s", exc)

    def _follow_encoders(self, policy: Policy) -> None:
        """Embedding models a new policy names load in the background (until then their requests get a 503
        with Retry-After, ``embedder``). Before, only the start loaded encoders, and every request of a class
        moved to another encoder failed until a restart. One no class names any more is dropped by the device
        thread once it has applied the swap (``EmbedService.forget_unused``): a batch it takes before runs on it."""
        wanted = {c.model for c in policy.classes.values() if c.kind == "embedding"}
        for name in sorted(wanted - set(self.embedders) - set(self._encoder_loads)):
            self._encoder_errors.pop(name, None)
            thread = threading.Thread(target=self._load_encoder, args=(name,), name=f"load-{name}", daemon=True)
            self._encoder_loads[name] = thread
            thread.start()

    def _encoders_wanted(self) -> set[str]:
        """The embedding models the newest policy names, and those loading (the device thread keeps these)."""
        return {c.model for c in self.policy.classes.values() if c.kind == "embedding"} | set(self._encoder_loads)

    def _load_encoder(self, name: str) -> None:
        try:
            started = time.monotonic()
            embedder = in_passing_thread(Embedder.load, self._folder(self._entry(name)), self.device)
            self.embedders[name] = embedder  # the embed service holds this dict: its next batch finds it
            log.info("embedding model %s loaded in %.1f s (the policy named it)", name, time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - its requests get a 503 naming it; the next policy change retries
            log.exception("loading embedding model %s failed", name)
            self._encoder_errors[name] = f"{type(exc).__name__}: {exc}"
        finally:
            self._encoder_loads.pop(name, None)

    def embedder(self, name: str) -> Embedder:
        """The loaded embedding model ``name``; ModelLoadingError (503) while a policy change loads it,
        ModelLoadError where that load failed."""
        embedder = self.embedders.get(name)
        if embedder is not None:
            return embedder
        if name in self._encoder_errors:
            raise ModelLoadError(name, f"loading embedding model {name!r} failed: {self._encoder_errors[name]}")
        raise ModelLoadingError(name, f"embedding model {name!r} is loading (a policy change named it); try again "
                                      "in a few seconds")

    def _load_llm(self, name: str) -> LLMEngine:
        return self._build_llm(name, self.policy)

    def _attach(self, name: str, engine: LLMEngine) -> Future[bool]:
        """A loaded LLM joins the device loop; the API sees it from then on."""
        self.llms = {**self.llms, name: engine}  # replaced, never mutated: other threads read it
        assert self.loop is not None
        return self.loop.post_model(name, engine)

    def _detach(self, name: str) -> Future[bool]:
        assert self.loop is not None
        left = self.loop.post_model(name, None)

        def forget(done: Future[bool]) -> None:
            if done.result():
                self.llms = {k: v for k, v in self.llms.items() if k != name}

        left.add_done_callback(forget)
        return left

    def _build_llm(self, name: str, policy: Policy) -> LLMEngine:
        """One LLM with its own KV pool and class scheduler (which plans the policy's classes of this model)."""
        cfg = self.config
        entry = self._entry(name)
        folder = self._folder(entry)
        # Steps are sized from this device's measured cost (`homeai bench calibrate`), fitted online after.
        seed = load_step_cost((cfg.cache_dir or default_cache_dir()) / CALIBRATION_FILE)
        scheduler = ClassScheduler(None, policy, model=name, step_cost=seed)
        kv_cache_mb = policy.model_policy(name).kv_cache_mb or cfg.kv_cache_mb  # the policy's, for this model
        ecfg = EngineConfig(device=str(self.device), dtype=cfg.dtype or entry.dtype, kv_cache_mb=kv_cache_mb,
                            max_model_len=cfg.max_model_len or entry.served_len,
                            quantization=entry.quantization,
                            compile_decode=cfg.compile_decode or compile_mode_from_env(),
                            cache_dir=cfg.cache_dir or default_cache_dir())
        return build_llm_engine(folder, ecfg, scheduler)

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.stop()
        if self.loop is not None:
            self.loop.shutdown()
            self.loop = None
        for engine in self.llms.values():
            if engine.runner.compiled is not None:
                engine.runner.compiled.stop()

    def catalog(self) -> ModelCatalog | None:
        """The repository as a new policy is checked against it: what is pulled, and what fits this device's
        memory budget (None: the repository cannot be read)."""
        try:
            entries = load_entries(self.config.models_dir)
        except EntryError as e:
            log.warning("cannot read the model repository to check policy models: %s", e)
            return None
        return build_catalog(entries, self.config.cache_dir or default_cache_dir(), self.device or self.config.device,
                             self.config.kv_cache_mb)

    def _entry(self, name: str) -> ModelEntry:
        if name not in self.entries:
            raise UnknownModelError(f"model {name!r} is not in the model repository")
        return self.entries[name]

    def _folder(self, entry: ModelEntry) -> Path:
        cache = self.config.cache_dir or default_cache_dir()
        if not entry.is_present(cache):
            if not self.config.pull_missing:
                raise UnknownModelError(f"model {entry.name!r} is not pulled; run `homeai pull {entry.name}`")
            return pull(entry, cache)
        return entry.local_path(cache)

    # ---- routing ---------------------------------------------------------------------------------
    def route(self, model: str | None, class_name: str | None, kind: str, user: str = "default") -> Route:
        """Class: explicit (header / key) > model alias > the user's default class > endpoint default."""
        policy = self.policy
        alias = policy.aliases.get(model or "")
        if class_name is None and alias is not None:
            class_name = alias.class_name
        if class_name is None and model and alias is None:
            class_name = self._class_serving(model, kind, user)
        if class_name is None:
            default = policy.user(user).default_class
            if default and policy.classes.get(default) is not None and policy.classes[default].kind == kind:
                class_name = default
        if class_name is None:
            class_name = "chat" if kind == "llm" else "embedding"
        cp = policy.classes.get(class_name)
        if cp is None:
            raise RequestError(f"unknown class {class_name!r}; known: {sorted(policy.classes)}")
        if cp.kind != kind:
            raise RequestError(f"class {class_name!r} serves {cp.kind}, not {kind}")
        if not policy.user(user).allows(class_name):
            raise PermissionError(f"user {user!r} may not use class {class_name!r}")
        if model and alias is None and model != cp.model and model not in self.served_models():
            raise UnknownModelError(f"model {model!r} not found")
        return Route(cp.model, class_name)

    def _class_serving(self, model: str, kind: str, user: str) -> str | None:
        """A request naming a model (not an alias) and no class: the user's default class if it serves that
        model, else the most important class the user may use that does (None: no class serves it)."""
        policy = self.policy
        default = policy.user(user).default_class
        if default and (cp := policy.classes.get(default)) is not None and cp.model == model and cp.kind == kind:
            return default
        serving = sorted((cp.priority + (1000 if cp.background else 0), name) for name, cp in policy.classes.items()
                         if cp.model == model and cp.kind == kind and policy.user(user).allows(name))
        return serving[0][1] if serving else None

    def served_models(self) -> list[str]:
        """Every model the policy serves, loaded or not (an on-demand LLM loads when a request needs it)."""
        pooled = self.pool.models if self.pool is not None else {}
        return sorted({*self.llms, *pooled, *self.embedders})

    def llm(self, model: str) -> LLMEngine:
        """A loaded LLM's engine (``ensure_llm`` first loads one that is not)."""
        engine = self.llms.get(model)
        if engine is None:
            if self.pool is not None and model in self.pool.models:
                raise QueueTimeoutError(f"model {model!r} is not loaded")
            raise UnknownModelError(f"LLM {model!r} is not served")
        return engine

    async def ensure_llm(self, model: str, timeout_s: float | None = None, class_name: str = "",
                         max_waiting: int = 0) -> LLMEngine:
        """The LLM's engine, loaded first if it is not (off the device thread: the other models step on
        meanwhile). The wait counts against ``timeout_s`` (the request's queue timeout; None: none), and
        raises QueueTimeoutError past it; ModelCapacityError when the model cannot fit, ModelLoadError when
        its load failed. Requests of ``class_name`` waiting for the load are held to ``max_waiting`` (its
        queue's max_queue_size; 0: no limit), as its queue would hold them: one more is QueueFullError (429)."""
        engine = self.llms.get(model)
        if engine is not None or self.pool is None or model not in self.pool.models:
            return engine if engine is not None else self.llm(model)
        future = self.pool.acquire(model)
        if future.done():
            return future.result()
        key = (model, class_name)
        if max_waiting and self.loading_waiters[key] >= max_waiting:
            raise QueueFullError(LOAD_RETRY_AFTER_S, class_name)
        self.loading_waiters[key] += 1
        self.pool.waiting(model, +1)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout_s)
        except TimeoutError:
            raise QueueTimeoutError(f"queue timeout: model {model!r} was still loading") from None
        finally:
            self.pool.waiting(model, -1)
            self.loading_waiters[key] -= 1

    def keep_alive(self, model: str, seconds: float | None, unload_now: bool = False) -> None:
        """Ollama's keep_alive for an LLM: it stays ``seconds`` after its last request (None: it stays; 0:
        it leaves once idle, at once with ``unload_now``). A pinned model stays whatever a client sends."""
        if self.pool is not None and model in self.pool.models and not self.policy.model_policy(model).pinned:
            self.pool.keep_alive(model, seconds, unload_now)

    # ---- requests --------------------------------------------------------------------------------
    def chat_prompt(self, model: str, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        return chat_prompt_ids(self.llm(model).tokenizer, messages, tools)

    def generate(self, route: Route, prompt_ids: list[int], params: SamplingParams, user: str,
                 request_id: str | None = None, priority_level: int | None = None,
                 timeout_us: int | None = None, kind: str = "completion") -> AsyncGenerator[TokenDelta, None]:
        """Stream token deltas. Awaiting the first one raises RequestError (400) or QueueFullError
        (429) at once; a queue timeout arrives as a delta with ``error`` set (503). Metered: ``kind``
        (chat, completion, response) goes into the record."""
        self.apply_class_limits(route, prompt_ids, params)
        engine = self.llm(route.model)
        request_id = request_id or uuid.uuid4().hex
        sub = Submission(request_id, kind, route.class_name, user, route.model, len(prompt_ids))

        def submit(engine: LLMEngine) -> AsyncGenerator[TokenDelta, None]:
            return engine.generate(prompt_ids, params, request_id, route.class_name, user, priority_level or None,
                                   timeout_us or None)

        return self.meter.stream(sub, self._leased(route, engine, submit, timeout_us))

    def apply_class_limits(self, route: Route, prompt_ids: list[int], params: SamplingParams) -> None:
        """The class's prompt limit (RequestError, 400) and output cap (``params.max_tokens`` lowered)."""
        cp = self.class_policy(route.class_name)
        if cp.max_prompt_tokens and len(prompt_ids) > cp.max_prompt_tokens:
            raise RequestError(f"prompt has {len(prompt_ids)} tokens; class {route.class_name!r} allows "
                               f"{cp.max_prompt_tokens}")
        if cp.max_output_tokens:
            params.max_tokens = min(params.max_tokens, cp.max_output_tokens)

    async def _leased(self, route: Route, engine: LLMEngine,
                      submit: Callable[[LLMEngine], AsyncGenerator[TokenDelta, None]],
                      timeout_us: int | None) -> AsyncGenerator[TokenDelta, None]:
        """``submit(engine)``'s stream, with its model kept on the device until it ends (keep_alive counts
        from then). A model that left the device between the request's lookup of it and its submission
        (``ModelUnloadedError``: its keep_alive ran out meanwhile) is loaded again and the request submitted
        once more; the lease, taken before, keeps it there this time."""
        model = route.model
        if self.closing is not None:  # admitted before the deadline, submitted after it (an on-demand load
            raise ShuttingDownError(self.closing)  # waited): no engine's fail-all would reach it, uvicorn cut it
        if self.pool is not None:
            self.pool.lease(model)
        stream = submit(engine)
        try:
            try:
                first = await anext(stream)
            except ModelUnloadedError:
                if self.pool is None or model not in self.pool.models:
                    raise
                log.info("model %s left the device as a request reached it: loading it again", model)
                engine = await self.ensure_llm(model, timeout_us / 1e6 if timeout_us else None, route.class_name)
                if self.closing is not None:
                    raise ShuttingDownError(self.closing) from None
                stream = submit(engine)
                first = await anext(stream)
            yield first
            async for delta in stream:
                yield delta
        except StopAsyncIteration:
            return
        finally:
            await stream.aclose()  # aborts the sequence if it has not finished
            if self.pool is not None:
                self.pool.release(model)

    async def embed(self, route: Route, inputs: list[str] | list[list[int]], user: str,
                    priority_level: int | None = None, timeout_us: int | None = None) -> EmbedResult:
        """Vectors for ``inputs`` (token rows, or texts tokenized here); metered as one submission."""
        assert self.embed_service is not None
        num_tokens = sum(len(row) for row in inputs if not isinstance(row, str))
        sub = Submission(uuid.uuid4().hex, "embedding", route.class_name, user, route.model, num_tokens)
        work = self.embed_service.embed(route.class_name, inputs, user, priority_level, timeout_us, route.model)
        return await self.meter.call(sub, work)

    # ---- stats -----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Queues and device as the device thread last published them (never read across threads)."""
        if self.loop is None:
            return {"classes": {}, "device": {}}
        snap = self.loop.snapshot() or {"classes": {}, "device": {}}
        return {**snap, **self._residency()}  # the pool's own lock: read now, not as last published

    def _residency(self) -> dict[str, Any]:
        """Every LLM's residency, and what the loaded models hold of the memory budget."""
        if self.pool is None:
            return {}
        return {"models": self.pool.snapshot(), "memory": {"budget_bytes": self.pool.budget_bytes,
                                                          "held_bytes": self.pool.held_bytes()}}

    def _build_snapshot(self) -> dict[str, Any]:
        """Runs on the device thread, which owns what it reads."""
        out: dict[str, Any] = {"classes": {}, "device": {}}
        engines = self.loop.llms if self.loop is not None else self.llms
        out["prefix_cache"] = merged_snapshot([e.scheduler.block_manager.stats for e in engines.values()])
        for name, engine in engines.items():
            sched = engine.scheduler
            bm = sched.block_manager
            out["device"][name] = {"kv_usage": bm.usage, "kv_blocks": bm.num_blocks,
                                   "steps": engine.stats.num_steps, "preemptions": engine.stats.num_preemptions,
                                   "last_batch_tokens": engine.stats.last_batch_tokens,
                                   "last_batch_seqs": engine.stats.last_batch_seqs,
                                   "prefix_cached_blocks": bm.num_cached_blocks,
                                   "prefix_evictions": bm.stats.num_evictions,
                                   "compiled_decode_steps": engine.runner.compiled_steps,
                                   "weights": engine.weights.quantization, "weights_reason": engine.weights.reason,
                                   "dtype": str(engine.runner.model.dtype).removeprefix("torch.")}
            if engine.runner.compiled is not None:
                out["device"][name]["compiled_decode"] = engine.runner.compiled.snapshot()
            if isinstance(sched, ClassScheduler):
                out["classes"].update(sched.class_stats())
        if self.batcher is not None:
            for name, q in self.batcher.embed_queues.items():
                out["classes"][name] = {"queued": len(q), "running": 0, "depth_by_level": q.depth_by_level()}
        out["engine_health"] = self.engine_health()
        return out

    def engine_health(self) -> dict[str, Any]:
        """Failures of LLM steps, embedding batches and the loop itself, merged (any thread may ask: it
        reads counters the device thread writes). ``failing``: the engine keeps failing (/readyz 503)."""
        parts = [*((name, e.health) for name, e in self.llms.items())]
        if self.embed_service is not None:
            parts.append(("embedding", self.embed_service.health))
        if self.loop is not None:
            parts.append(("loop", self.loop.health))
        errors = [{"source": source, **err} for source, health in parts for err in health.error_list()]
        failing = [h for _, h in parts if h.failing]
        last = max((h for _, h in parts if h.last_error_s is not None), key=lambda h: h.last_error_s or 0.0,
                   default=None)
        return {"failing": bool(failing), "last_error": last.last_error if last else None, "errors": errors}
