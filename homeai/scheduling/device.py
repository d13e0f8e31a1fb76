"""One iteration of the device, shared by the real device loop and the simulator.

Whatever runs the work (the accelerator behind ``DeviceLoop``, a cost model behind ``Simulator``)
implements ``Device``; ``run_once`` is the single place that applies posted requests, answers timeouts,
asks the batcher and accounts the work. The caller's thread owns the queues, the scheduler and the
batcher: other threads only post to the device's inbox, so no lock decides who mutates what.
"""

from __future__ import annotations

from typing import Protocol

from homeai.scheduling.batcher import LLM_STEP, Batcher, EmbedWork


class Device(Protocol):
    """Runs what the batcher chooses, on the thread that owns the scheduling state."""

    def apply_inbox(self) -> None:
        """Apply what other threads posted (adds, aborts, cancels, policy swaps), in posting order."""

    def fail_expired(self) -> None:
        """Answer every request whose queue timeout passed (REJECT): nobody waits on a dead request."""

    def llm_step(self, model: str | None = None) -> bool:
        """Plan, run and apply one step of ``model``'s LLM (None: the only one); False when the plan was
        empty (nothing ran)."""

    def embed_batch(self, work: EmbedWork) -> None:
        """Run one embedding batch and answer its requests."""


def run_once(batcher: Batcher, device: Device) -> bool:
    """Apply the inbox, then run one piece of work; False when nothing was ready (the caller then
    sleeps until ``batcher.next_wake_s(after=now)`` or new work, never spinning)."""
    device.apply_inbox()
    device.fail_expired()
    work = batcher.take_next()
    start = batcher.clock.now()
    if work == LLM_STEP:
        if device.llm_step(batcher.step_model):
            batcher.record(LLM_STEP, start, batcher.clock.now())
            return True
        # Its plan was empty (a request that cannot get its KV yet): the LLM's turn is over all the same, and
        # an embedding batch it held back goes now. Before, every turn went to the empty step while it lasted,
        # and the search requests behind it waited for good.
        batcher.llm_turn_passed()
        work = batcher.take_next()
        if work == LLM_STEP:
            return False
    if work is None:
        return False
    assert isinstance(work, EmbedWork)
    device.embed_batch(work)
    batcher.record(work.class_name, start, batcher.clock.now(), len(work.items))
    return True
