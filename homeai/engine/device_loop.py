"""The one thread that owns the accelerator: asks the batcher what to run next and runs it.

Without a batcher (standalone LLM use) every iteration is an LLM step. With one, an iteration is an
LLM step or an embedding batch, whichever the batcher picks; each piece of work is timed on the
batcher's clock so that background shares and ITL slack are measured, not guessed.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from homeai.scheduling.batcher import LLM_STEP, Batcher, EmbedWork

if TYPE_CHECKING:
    from homeai.engine.embed_service import EmbedService
    from homeai.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5


class DeviceLoop:
    def __init__(self, llm: LLMEngine | None = None, batcher: Batcher | None = None,
                 embed: EmbedService | None = None) -> None:
        self.llm = llm
        self.batcher = batcher
        self.embed = embed
        self.wake = llm.wake if llm is not None else threading.Event()
        if embed is not None:
            embed.wake = self.wake
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_iterations = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="homeai-device", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.wake.clear()  # before looking for work, so a wake-up set after this is never lost
            try:
                did_work = self.run_once()
            except Exception as exc:  # one bad batch must never kill the loop
                log.exception("device loop iteration failed")
                if self.llm is not None:
                    self.llm.on_step_error = exc
                    self.llm.fail_all(f"engine error: {exc}")
                did_work = False
            if not did_work:
                self._idle_wait()

    def run_once(self) -> bool:
        """Run one piece of work; False when there was nothing ready."""
        if self.llm is not None:
            self.llm.drain_inbox()
        if self.embed is not None:
            self.embed.fail_expired()
        if self.batcher is None:
            return self._llm_step() if self.llm is not None and self.llm.scheduler.has_work() else False
        work = self.batcher.next_work()
        if work is None:
            return False
        start = self.batcher.clock.now()
        if work == LLM_STEP:
            if not self._llm_step():
                return False
            self.batcher.record(LLM_STEP, start, self.batcher.clock.now())
        else:
            assert isinstance(work, EmbedWork) and self.embed is not None
            self.embed.run(work)
            self.batcher.record(work.class_name, start, self.batcher.clock.now(), len(work.items))
        self.num_iterations += 1
        return True

    def _llm_step(self) -> bool:
        assert self.llm is not None
        deltas = self.llm.step()
        return bool(deltas) or self.llm.stats.last_batch_seqs > 0

    def _idle_wait(self) -> None:
        timeout = IDLE_WAIT_S
        wake_at = self._next_wake()
        if wake_at is not None:
            clock: Any = self.batcher.clock if self.batcher is not None else self.llm.scheduler.clock  # type: ignore[union-attr]
            timeout = min(timeout, max(0.0, wake_at - clock.now()))
        if timeout > 0:
            self.wake.wait(timeout)

    def _next_wake(self) -> float | None:
        if self.batcher is not None:
            return self.batcher.next_wake_s()
        if self.llm is not None:
            return self.llm.scheduler.next_wake_s()
        return None
