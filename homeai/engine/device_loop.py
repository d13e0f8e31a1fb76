"""The one thread that owns the accelerator and every piece of scheduling state.

The queues, the class scheduler and the batcher are touched by this thread only (as vLLM v1's engine
core owns its scheduler): HTTP handlers and jobs post adds, aborts and cancels to the engines' inboxes
and policy swaps to ``post_policy``; they read the state through ``snapshot()``, which this thread
publishes after its iterations. Each iteration is ``run_once`` (shared with the simulator): an LLM step
or an embedding batch, whichever the batcher picks, timed on the batcher's clock so that background
shares and ITL slack are measured, not guessed. With nothing ready it sleeps until the next deadline
(a delay window closing, a timeout) or until work is posted, never spinning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from homeai.engine.health import FAILING_AFTER, EngineHealth
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import Batcher, EmbedWork
from homeai.scheduling.clock import Clock
from homeai.scheduling.device import run_once

if TYPE_CHECKING:
    from homeai.engine.embed_service import EmbedService
    from homeai.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5
SNAPSHOT_EVERY_S = 0.05  # the published view may lag this much behind a busy device (scrapes take seconds)
Snapshot = dict[str, Any]


class DeviceLoop:
    """Runs the device; the only thread that mutates queues, scheduler and batcher (module docstring)."""

    def __init__(self, llm: LLMEngine | None = None, batcher: Batcher | None = None,
                 embed: EmbedService | None = None,
                 build_snapshot: Callable[[], Snapshot] | None = None) -> None:
        self.llm = llm
        self.batcher = batcher
        self.embed = embed
        self.wake = llm.wake if llm is not None else threading.Event()
        if embed is not None:
            embed.wake = self.wake
        self.health = EngineHealth()  # failures outside any step or batch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_iterations = 0
        self._policies: list[Policy] = []
        self._policies_lock = threading.Lock()
        self._build_snapshot = build_snapshot
        self._snapshot: Snapshot = {}
        self._snapshot_at_s = float("-inf")

    @property
    def clock(self) -> Clock:
        if self.batcher is not None:
            return self.batcher.clock
        assert self.llm is not None
        return self.llm.scheduler.clock

    # ---- other threads ---------------------------------------------------------------------------
    def post_policy(self, policy: Policy) -> None:
        """Swap the policy from any thread: applied before the next iteration, before any request
        posted after this call (so a request routed by the new policy finds its class)."""
        with self._policies_lock:
            self._policies.append(policy)
        self.wake.set()

    def snapshot(self) -> Snapshot:
        """The last published view of queues and device (a new dict each time: never mutated)."""
        return self._snapshot

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="homeai-device", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

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
            if not did_work:
                self._idle_wait()  # after a failure too: the loop never spins on one

    def _loop_failed(self, exc: Exception) -> None:
        """A failure no step or batch claims (planning, the inbox): logged and counted; only when it
        repeats with no success between are the LLM's requests ended, so none waits on a broken loop."""
        self.health.failed("loop", exc)
        log.error("device loop iteration failed (%d in a row)", self.health.consecutive_failures, exc_info=exc)
        if self.health.consecutive_failures >= FAILING_AFTER and self.llm is not None:
            self.llm.fail_all(f"engine error: {type(exc).__name__}: {exc}")

    def run_once(self) -> bool:
        """Run one piece of work; False when there was nothing ready."""
        if self.batcher is not None:
            return run_once(self.batcher, self)
        self.apply_inbox()  # standalone LLM (CLI chat, benchmarks): every iteration is an LLM step
        assert self.llm is not None
        return self.llm.scheduler.can_step(self.clock.now()) and self.llm_step()

    # Device protocol (homeai.scheduling.device)
    def apply_inbox(self) -> None:
        with self._policies_lock:
            policies, self._policies = self._policies, []
        for policy in policies:  # first: requests posted after a swap are routed by the new policy
            assert self.batcher is not None, "a policy swap needs the batcher"
            self.batcher.apply_policy(policy)
        if self.llm is not None:
            self.llm.drain_inbox()
        if self.embed is not None:
            self.embed.apply_inbox()

    def fail_expired(self) -> None:
        if self.embed is not None:
            self.embed.fail_expired()

    def llm_step(self) -> bool:
        assert self.llm is not None
        deltas = self.llm.step()
        self.num_iterations += 1
        return bool(deltas) or self.llm.stats.last_batch_seqs > 0

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
        """Sleep until the next deadline after now, or until something is posted (``wake``)."""
        now = self.clock.now()
        wake_at = self._next_wake(now)
        timeout = IDLE_WAIT_S if wake_at is None else min(IDLE_WAIT_S, wake_at - now)
        self.wake.wait(timeout)

    def _next_wake(self, now: float) -> float | None:
        if self.batcher is not None:
            return self.batcher.next_wake_s(after=now)
        if self.llm is not None:
            return self.llm.scheduler.next_wake_s(after=now)
        return None
