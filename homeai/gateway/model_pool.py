"""Which LLMs are on the device, and for how long: the memory budget, pinned models, keep_alive.

Each LLM the policy names has a ``Residency``: unloaded, loading, loaded or unloading. A pinned model
(voice's) loads at start and never leaves; a ``load: start`` model loads at start too; an on-demand model
loads when a request needs it. A loaded model that is not pinned leaves once it has been idle (no request
streaming from it, none routed to it in the last ``UNLOAD_GRACE_S``) for its keep_alive: the policy's,
or the one the last request sent (Ollama's ``keep_alive``: 0 unloads it as soon as it is idle, negative
keeps it).

A load never runs on the device thread: a thread of its own builds the engine (weights, KV cache) while
the device loop goes on stepping the other models, then the device thread takes it in (``attach``).
Before it starts, the budget must hold it: the weights and KV caches of the loaded and loading models plus
the encoders' weights, plus this model's estimate. If they do not, idle models that are not pinned leave,
least recently used first; if even that is not enough the request gets ``ModelCapacityError`` (503 naming
the model), and nothing pinned or busy is evicted. An unload asks the device thread to let the model go
(it refuses while the model has work), then frees its memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from homeai.engine.errors import ModelCapacityError, ModelLoadError
from homeai.engine.llm_engine import LLMEngine
from homeai.policy.durations import describe_keep_alive
from homeai.policy.schema import ModelPolicy, Policy

log = logging.getLogger(__name__)

UNLOAD_GRACE_S = 2.0  # a model routed to this recently stays: its request is being prepared (tokenized)
IDLE_CHECK_S = 60.0  # the residency thread looks at least this often
MB = 2**20


@dataclass(slots=True)
class Residency:
    """One LLM's place on the device."""

    name: str
    policy: ModelPolicy
    estimate_bytes: int = 0  # weights + KV cache, before it loads
    state: str = "unloaded"  # unloaded | loading | loaded | unloading
    engine: LLMEngine | None = None
    weights_bytes: int = 0  # measured once loaded
    kv_bytes: int = 0
    load_s: float | None = None
    loaded_at: float | None = None  # wall clock
    num_loads: int = 0
    leases: int = 0  # requests streaming from it now
    used_s: float = float("-inf")  # monotonic: a request was routed to it, or ended
    keep_alive_s: float | None = None  # after its last request; None: stays
    retired: bool = False  # the policy no longer names it: it leaves once idle
    future: Future[LLMEngine] | None = None
    error: str | None = None  # why the last load failed
    waiting: int = 0  # requests waiting for it to load
    transition: threading.Lock = field(default_factory=threading.Lock)  # one load or unload at a time

    @property
    def bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes if self.state == "loaded" else self.estimate_bytes

    @property
    def holds_memory(self) -> bool:
        return self.state != "unloaded"

    @property
    def pinned(self) -> bool:
        """Pinned by the policy that names it (a model the new policy dropped is not: it kept its old settings,
        and a pinned one stayed on the device for good, counted against the memory budget)."""
        return self.policy.pinned and not self.retired

    def expires_s(self) -> float | None:
        """When it leaves if nothing uses it meanwhile (monotonic); None: it stays."""
        if self.pinned or (self.keep_alive_s is None and not self.retired):
            return None
        return self.used_s + (0.0 if self.retired else self.keep_alive_s or 0.0)

    def leaves_s(self) -> float | None:
        """When the residency thread unloads it if nothing uses it meanwhile: its expiry, but never within
        ``UNLOAD_GRACE_S`` of a request routed to it (keep_alive 0 would otherwise unload the model under the
        very request that sent it, between its load check and its tokenizing)."""
        expires = self.expires_s()
        return None if expires is None else max(expires, self.used_s + UNLOAD_GRACE_S)


@dataclass
class ModelPool:
    """The residency of every LLM (see the module docstring). ``load`` builds an engine (in a thread of
    its own, never the device thread), ``attach`` and ``detach`` hand it to and take it from the device
    loop (their futures say when that happened; detach's False: the model still had work), ``free``
    stops what still runs for it and returns what gives its memory back, called once the pool holds the
    engine no more (while a caller's name for it lives, its tensors stay allocated and nothing is freed)."""

    budget_bytes: int | None
    load: Callable[[str], LLMEngine]
    attach: Callable[[str, LLMEngine], Future[bool]]
    detach: Callable[[str], Future[bool]]
    free: Callable[[LLMEngine], Callable[[], None] | None]
    measure: Callable[[LLMEngine], tuple[int, int]]
    fixed_bytes: int = 0  # the encoders' weights: nothing evicts them
    clock: Callable[[], float] = time.monotonic
    models: dict[str, Residency] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- policy ------------------------------------------------------------------------------------
    def configure(self, policy: Policy, estimates: dict[str, int]) -> list[str]:
        """Follow a policy: its LLMs get (or keep) a residency; those it no longer names leave once idle.
        Returns the models to load now (pinned or ``load: start``, not loaded yet)."""
        with self._lock:
            names = policy.llm_models()
            for name in names:
                mp = policy.model_policy(name)
                res = self.models.get(name)
                if res is None:
                    res = self.models[name] = Residency(name, mp, keep_alive_s=mp.keep_alive_s)
                elif res.policy != mp:
                    res.keep_alive_s = mp.keep_alive_s
                res.policy, res.retired = mp, False
                res.estimate_bytes = estimates.get(name, res.estimate_bytes)
            for name, res in self.models.items():
                res.retired = name not in names
            out = [n for n in names if self.models[n].state == "unloaded"
                   and (self.models[n].policy.pinned or self.models[n].policy.load == "start")]
        self._wake.set()
        return out

    # ---- requests ----------------------------------------------------------------------------------
    def acquire(self, name: str) -> Future[LLMEngine]:
        """The model's engine once loaded (a done future when it is); starts its load when it is not.
        Raises ModelCapacityError at once when it cannot fit (nothing is evicted then)."""
        with self._lock:
            res = self.models[name]
            res.used_s = self.clock()
            if res.state == "loaded" and res.engine is not None:
                done: Future[LLMEngine] = Future()
                done.set_result(res.engine)
                return done
            if res.state in ("loading", "unloading") and res.future is not None:
                return res.future
            victims = self._make_room(res)
            res.state, res.future, res.error = "loading", Future(), None
            future = res.future
        threading.Thread(target=self._load, args=(res, victims), name=f"homeai-load-{name}", daemon=True).start()
        return future

    def lease(self, name: str) -> None:
        """A request streams from the model now: it does not leave meanwhile."""
        with self._lock:
            res = self.models.get(name)
            if res is None:
                return
            res.leases += 1
            res.used_s = self.clock()

    def release(self, name: str) -> None:
        with self._lock:
            res = self.models.get(name)
            if res is None:
                return
            res.leases = max(0, res.leases - 1)
            res.used_s = self.clock()
        self._wake.set()

    def keep_alive(self, name: str, keep_alive_s: float | None, unload_now: bool = False) -> None:
        """Ollama's keep_alive of a request: the model stays that long after its last request (0: it leaves
        as soon as it is idle). ``unload_now``: a request that only unloads it (no grace)."""
        with self._lock:
            res = self.models.get(name)
            if res is None:
                return
            res.keep_alive_s = keep_alive_s
            res.used_s = float("-inf") if unload_now else self.clock()
        self._wake.set()

    # ---- loading and unloading --------------------------------------------------------------------
    def load_now(self, names: list[str]) -> None:
        """Load these models and wait (a start: pinned and ``load: start`` models); a failure raises."""
        for name in names:
            self.acquire(name).result()

    def _make_room(self, res: Residency) -> list[Residency]:
        """The idle models that leave so that ``res`` fits the budget (least recently used first, none
        pinned, busy or used within the grace); ModelCapacityError when even all of them are not enough."""
        if self.budget_bytes is None:
            return []
        held = self.fixed_bytes + sum(r.bytes for r in self.models.values() if r.holds_memory and r is not res)
        need = res.estimate_bytes
        if held + need <= self.budget_bytes:
            return []
        now = self.clock()
        idle = sorted((r for r in self.models.values() if self._evictable(r, now)), key=lambda r: r.used_s)
        victims, freed = [], 0
        for victim in idle:
            victims.append(victim)
            freed += victim.bytes
            if held - freed + need <= self.budget_bytes:
                for v in victims:
                    v.state = "unloading"
                return victims
        stay = [r.name for r in self.models.values() if r.holds_memory and r is not res and r not in idle]
        raise ModelCapacityError(res.name, (
            f"model {res.name!r} ({need / MB:.0f} MB) does not fit in the memory budget ({self.budget_bytes / MB:.0f} "
            f"MB): {held / MB:.0f} MB are held by the encoders and by {', '.join(map(repr, stay)) or 'nothing'} "
            f"(pinned or serving requests), which stay"))

    def _evictable(self, r: Residency, now: float) -> bool:
        return r.state == "loaded" and not r.pinned and r.leases == 0 and r.waiting == 0 \
            and now - r.used_s >= UNLOAD_GRACE_S and (r.engine is None or r.engine.is_idle())

    def _load(self, res: Residency, victims: list[Residency]) -> None:
        assert res.future is not None
        future = res.future
        try:
            for victim in victims:
                if not self._unload(victim):
                    log.warning("model %s got work while making room for %s: loading it anyway", victim.name,
                                res.name)
            with res.transition:  # after its own unload, if one was under way
                t0 = time.perf_counter()
                engine = self.load(res.name)
                load_s = time.perf_counter() - t0
                weights, kv = self.measure(engine)
                self.attach(res.name, engine).result()
        except Exception as exc:  # noqa: BLE001 - a failed load answers its waiters; the next request retries
            log.error("loading model %s failed", res.name, exc_info=exc)
            with self._lock:
                res.state, res.error, res.future = "unloaded", f"{type(exc).__name__}: {exc}", None
            future.set_exception(ModelLoadError(res.name, f"model {res.name!r} could not be loaded: {exc}"))
            return
        with self._lock:
            res.engine, res.weights_bytes, res.kv_bytes = engine, weights, kv
            res.state, res.load_s, res.loaded_at, res.future = "loaded", load_s, time.time(), None
            res.num_loads += 1
            res.used_s = self.clock()
        log.info("model %s loaded in %.2f s (%.0f MB weights, %.0f MB KV cache; keep_alive %s)", res.name, load_s,
                 weights / MB, kv / MB, "pinned" if res.pinned else describe_keep_alive(res.keep_alive_s))
        future.set_result(engine)
        self._wake.set()

    def _unload(self, res: Residency) -> bool:
        """Take the model off the device (the device thread refuses while it has work) and free it."""
        with res.transition:
            with self._lock:
                if res.engine is None or res.state not in ("loaded", "unloading"):
                    return False
                res.state = "unloading"
            left = self.detach(res.name).result()
            with self._lock:
                if not left:
                    if res.state == "unloading":
                        res.state = "loaded"
                    return False
                engine, res.engine = res.engine, None
            if engine is not None:
                reclaim = self.free(engine)
                del engine  # the last reference: its tensors are freed here
                if reclaim is not None:
                    reclaim()
            with self._lock:
                res.weights_bytes, res.kv_bytes = 0, 0
                if res.state == "unloading":  # else a request is loading it again (after this)
                    res.state = "unloaded"
        log.info("model %s unloaded", res.name)
        return True

    # ---- the residency thread: keep_alive ---------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="homeai-residency", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            wait: float | None = IDLE_CHECK_S
            try:  # the thread must go on whatever fails: no model would ever leave again
                for res in self._expired(self.clock()):
                    try:
                        self._unload(res)
                    except Exception:  # noqa: BLE001 - the model stays loaded
                        log.exception("unloading model %s failed", res.name)
                wait = self._next_expiry(self.clock())
            except Exception:  # noqa: BLE001 - e.g. an engine's is_idle() during a policy swap
                log.exception("checking which models to unload failed; checking again in %.0f s", IDLE_CHECK_S)
            self._wake.wait(IDLE_CHECK_S if wait is None else max(0.0, min(IDLE_CHECK_S, wait)))

    def _expired(self, now: float) -> list[Residency]:
        with self._lock:
            return [r for r in self.models.values() if r.state == "loaded" and r.leases == 0 and r.waiting == 0
                    and (t := r.leaves_s()) is not None and t <= now
                    and (r.engine is None or r.engine.is_idle())]

    def _next_expiry(self, now: float) -> float | None:
        with self._lock:
            times = [t - now for r in self.models.values() if r.state == "loaded" and (t := r.leaves_s()) is not None]
            busy = any(r.state == "loaded" and r.expires_s() is not None and (r.leases or r.waiting)
                       for r in self.models.values())
        if busy:  # an expired model still serving: look again soon
            times.append(UNLOAD_GRACE_S)
        return min(times) if times else None

    # ---- what /api/ps and /v1/stats show ----------------------------------------------------------
    def snapshot(self) -> dict[str, dict[str, Any]]:
        now, wall = self.clock(), time.time()
        with self._lock:
            out = {}
            for name, r in self.models.items():
                expires = r.expires_s()
                out[name] = {
                    "state": r.state, "loaded": r.state == "loaded", "pinned": r.pinned,
                    "load": r.policy.load, "resident_bytes": r.weights_bytes + r.kv_bytes if r.state == "loaded" else 0,
                    "weights_bytes": r.weights_bytes, "kv_cache_bytes": r.kv_bytes, "estimate_bytes": r.estimate_bytes,
                    "load_s": r.load_s, "loaded_at": r.loaded_at, "num_loads": r.num_loads, "requests": r.leases,
                    "waiting_for_load": r.waiting, "keep_alive": "pinned" if r.pinned else
                    describe_keep_alive(r.keep_alive_s),
                    # while requests stream, it expires keep_alive after the last one ends (not before now)
                    "expires_at": None if expires is None else wall + max(0.0, expires - now)
                    + (max(r.keep_alive_s or 0.0, 0.0) if r.leases else 0.0),
                    "last_error": r.error}
            return out

    def held_bytes(self) -> int:
        with self._lock:
            return self.fixed_bytes + sum(r.bytes for r in self.models.values() if r.holds_memory)

    def waiting(self, name: str, delta: int) -> None:
        """A request starts (+1) or stops (-1) waiting for the model's load (it stays meanwhile)."""
        with self._lock:
            res = self.models.get(name)
            if res is not None:
                res.waiting = max(0, res.waiting + delta)
