"""The one thread that owns the accelerator and every piece of scheduling state.

The queues, the class scheduler and the batcher are touched by this thread only (as vLLM v1's engine
core owns its scheduler): HTTP handlers and jobs post adds, aborts and cancels to the engines' inboxes
and policy swaps to ``post_policy``; they read the state through ``snapshot()``, which this thread
publishes after its iterations. Each iteration is ``run_once`` (shared with the simulator): a step of
one of the LLMs (each with its own engine, KV cache and scheduler) or an embedding batch, whichever the
batcher picks, timed on the batcher's clock so that background
shares and ITL slack are measured, not guessed. With nothing ready it sleeps until the next deadline
(a delay window closing, a timeout) or until work is posted, never spinning on a failure. Where the
device is a CPU it first keeps its cores warm for ``KEEP_WARM_S`` after the last piece of work
(``homeai.runtime.kernels.keep_warm``: the threads run and yield), so that a request arriving soon after
another does not wait for idle cores to wake.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from homeai.engine.embed_service import EmbedService
from homeai.engine.health import FAILING_AFTER, EngineHealth
from homeai.engine.llm_engine import LLMEngine
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import Batcher, EmbedWork
from homeai.scheduling.clock import Clock
from homeai.scheduling.device import run_once

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5
# How long the CPU's threads stay warm after the last step or batch (HOMEAI_KEEP_WARM_MS; 0: never).
# Measured on a 2-vCPU VM: a one-token step took 16 ms after 100 ms of quiet against 5 warm, and the serve
# bench's repeated prompt 29.7 -> 15.2 ms (README, "Idle cores"). 200 ms is what Intel's OpenMP spins by
# default; llama.cpp's threads poll for work after each graph as well.
KEEP_WARM_S = float(os.environ.get("HOMEAI_KEEP_WARM_MS", "200")) / 1e3
# The loop looks for posted work between slices, so a request posted meanwhile waits up to one slice: 500 us
# gave a new prompt 0.33 ms (p50) from its submit to the loop taking it, 100 us 0.09 ms; a slice's own cost
# (a parallel region's start, a Python round) is a few microseconds.
KEEP_WARM_SLICE_US = 100
SNAPSHOT_EVERY_S = 0.05  # the published view may lag this much behind a busy device (scrapes take seconds)
Snapshot = dict[str, Any]


class DeviceLoop:
    """Runs the device; the only thread that mutates queues, scheduler and batcher (module docstring)."""

    def __init__(self, llm: LLMEngine | None, batcher: Batcher, embed: EmbedService | None = None,
                 build_snapshot: Callable[[], Snapshot] | None = None,
                 llms: dict[str, LLMEngine] | None = None,
                 encoders_wanted: Callable[[], set[str]] | None = None) -> None:
        # Engines by model, as the batcher's ModelSet names them (one engine: its scheduler's model).
        self.llms: dict[str, LLMEngine] = dict(llms or {})
        if llm is not None:
            self.llms[llm.scheduler.model or "llm"] = llm
        for name, engine in self.llms.items():
            engine.name = name
        self.batcher = batcher
        self.embed = embed
        # One event wakes the loop, whoever posts: the engines are built around the same one.
        wakes = {id(w): w for w in (*(e.wake for e in self.llms.values()), embed.wake if embed else None)
                 if w is not None}
        if len(wakes) > 1:
            raise ValueError("the LLM engines and the embedding service must share the device loop's wake event")
        self.wake = next(iter(wakes.values()), threading.Event())
        self._models_posted: list[tuple[str, LLMEngine | None, Future[bool]]] = []  # loaded / to unload
        self.health = EngineHealth()  # failures outside any step or batch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_iterations = 0
        self._policies: list[Policy] = []
        self._policies_lock = threading.Lock()
        self._build_snapshot = build_snapshot
        # the embedding models a newer policy (or a load under way) still needs: after a swap the device
        # thread drops the others (``EmbedService.forget_unused``); None: none is dropped
        self._encoders_wanted = encoders_wanted
        self._snapshot: Snapshot = {}
        self._snapshot_at_s = float("-inf")
        self._last_work_at = float("-inf")  # time.monotonic() of the last step or batch (keep-warm)

    @property
    def clock(self) -> Clock:
        return self.batcher.clock

    @property
    def llm(self) -> LLMEngine | None:
        """The only (or first) LLM engine."""
        return next(iter(self.llms.values()), None)

    # ---- other threads ---------------------------------------------------------------------------
    def post_policy(self, policy: Policy) -> None:
        """Swap the policy from any thread: applied before the next iteration, before any request
        posted after this call (so a request routed by the new policy finds its class)."""
        with self._policies_lock:
            self._policies.append(policy)
        self.wake.set()

    def post_model(self, name: str, engine: LLMEngine | None) -> Future[bool]:
        """From any thread: a loaded model joins the device (``engine``), or leaves it (None) once it has
        no work; the future says whether it did (False: it still had work, or was not there)."""
        done: Future[bool] = Future()
        if engine is not None:
            engine.wake = self.wake
        with self._policies_lock:
            self._models_posted.append((name, engine, done))
        self.wake.set()
        return done

    def snapshot(self) -> Snapshot:
        """The last published view of queues and device (a new dict each time: never mutated)."""
        return self._snapshot

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="homeai-device", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the loop (and the LLM's background compilation, which serves nobody once it stops)."""
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        compiles = [e.runner.compiled for e in self.llms.values() if e.runner.compiled is not None]
        for compiled in compiles:  # all at once: they share one wait for the buckets being compiled
            compiled.request_stop()
        for compiled in compiles:
            compiled.stop()

    # ---- the device thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self.wake.clear()  # before looking for work, so a wake-up set after this is never lost
            try:
                did_work = self.run_once()
                self.health.succeeded()
            except Exception as exc:  # noqa: BLE001 - outside any step (a step contains its own failures)
                did_work = False
                self._loop_failed(exc)
            self._publish(force=not did_work)
            if did_work:
                self._last_work_at = time.monotonic()
            else:
                self._idle_wait()  # after a failure too: the loop never spins on one

    def _loop_failed(self, exc: Exception) -> None:
        """A failure no step or batch claims (planning, the inbox): logged and counted; only when it
        repeats with no success between are the requests ended (every LLM's and every embedding input,
        queued or posted), so none waits on a broken loop."""
        self.health.failed("loop", exc)
        log.error("device loop iteration failed (%d in a row)", self.health.consecutive_failures, exc_info=exc)
        if self.health.consecutive_failures >= FAILING_AFTER:
            message = f"engine error: {type(exc).__name__}: {exc}"
            ends = [engine.fail_all for engine in self.llms.values()]
            if self.embed is not None:
                ends.append(self.embed.fail_all)
            for end in ends:
                try:
                    end(message)
                except Exception:  # noqa: BLE001 - the others must still be answered
                    log.exception("ending the requests after the loop's failures failed")

    def run_once(self) -> bool:
        """Run one piece of work; False when there was nothing ready."""
        return run_once(self.batcher, self)

    # Device protocol (homeai.scheduling.device)
    def apply_inbox(self) -> None:
        with self._policies_lock:
            policies, self._policies = self._policies, []
            models, self._models_posted = self._models_posted, []
        for policy in policies:  # first: requests posted after a swap are routed by the new policy
            self.batcher.apply_policy(policy)
        if policies and self.embed is not None and self._encoders_wanted is not None:
            applied = {c.model for c in self.batcher.policy.classes.values() if c.kind == "embedding"}
            self.embed.forget_unused(applied | self._encoders_wanted())
        for name, engine, done in models:
            done.set_result(self._join(name, engine) if engine is not None else self._leave(name))
        for engine in self.llms.values():
            engine.drain_inbox()
        if self.embed is not None:
            self.embed.apply_inbox()

    def _join(self, name: str, engine: LLMEngine) -> bool:
        self.llms[name] = engine
        engine.name = name
        engine.scheduler.apply_policy(self.batcher.policy)  # the policy may have changed while it loaded
        if self.batcher.llm is not None:
            self.batcher.llm.add(name, engine.scheduler)
        return True

    def _leave(self, name: str) -> bool:
        engine = self.llms.get(name)
        if engine is None or not engine.leave_if_idle():
            return False
        del self.llms[name]
        if self.batcher.llm is not None:
            self.batcher.llm.remove(name)
        return True

    def fail_expired(self) -> None:
        if self.embed is not None:
            self.embed.fail_expired()

    def llm_step(self, model: str | None = None) -> bool:
        engine = self.llms[model] if model is not None else self.llm
        assert engine is not None
        deltas = engine.step()
        self.num_iterations += 1
        return bool(deltas) or engine.stats.last_batch_seqs > 0

    def embed_batch(self, work: EmbedWork) -> None:
        assert self.embed is not None
        self.embed.run(work)
        self.num_iterations += 1

    def _publish(self, force: bool) -> None:
        if self._build_snapshot is None:
            return
        now = self.clock.now()
        if force or now - self._snapshot_at_s >= SNAPSHOT_EVERY_S:
            self._snapshot = self._build_snapshot()
            self._snapshot_at_s = now

    def _idle_wait(self) -> None:
        """Sleep until the next deadline after now, or until something is posted (``wake``); within
        ``KEEP_WARM_S`` of the last work, on a CPU, keep the cores running meanwhile."""
        now = self.clock.now()
        wake_at = self._next_wake(now)
        timeout = IDLE_WAIT_S if wake_at is None else min(IDLE_WAIT_S, wake_at - now)
        start = time.monotonic()
        warm_until = min(self._last_work_at + KEEP_WARM_S, start + timeout)
        if warm_until > start and (keep_warm := self._keep_warm()) is not None:
            while not self.wake.is_set() and time.monotonic() < warm_until:
                keep_warm(KEEP_WARM_SLICE_US)
            if self.wake.is_set():
                return
            timeout -= time.monotonic() - start
        if timeout > 0:
            self.wake.wait(timeout)

    def _keep_warm(self) -> Callable[[int], None] | None:
        """The keep-warm op where an LLM of this loop runs on the CPU and the native kernels are loaded,
        else None."""
        if not any(e.runner.device.type == "cpu" for e in self.llms.values()):
            return None
        from homeai.runtime.kernels import keep_warm

        return keep_warm()

    def _next_wake(self, now: float) -> float | None:
        return self.batcher.next_wake_s(after=now)


def run_alone(llm: LLMEngine) -> DeviceLoop:
    """A started device loop for one LLM engine and no embedding model (``homeai chat``, the benches,
    tests): the loop and batcher the server runs, under a policy of one class for whatever the engine's
    own scheduler plans. Stop it with ``shutdown()``."""
    policy = Policy.model_validate({"classes": {"default": {"kind": "llm", "model": "alone"}}})
    loop = DeviceLoop(llm, Batcher(policy, llm.scheduler, llm.scheduler.clock))
    loop.start()
    return loop
