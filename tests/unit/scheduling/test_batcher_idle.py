"""An idle-looking device on virtual time with the default policy: what is ready runs, nothing spins.

A background LLM request behind its closed delay window made the batcher answer "LLM step" (an empty
one) instead of a ready interactive embedding batch, and the device loop spun on a 0 s wait; the
simulator dropped a wake time equal to now and never ran the query. And a forced background batch was
formed "as if" at the end of its delay window, so timeouts were applied at that future time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams
from homeai.policy.loader import load_policy
from homeai.policy.schema import ClassPolicy, Policy
from homeai.scheduling.batcher import Batcher, EmbedWork
from homeai.scheduling.class_queue import ClassQueue, QueuedItem
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock
from homeai.sim.cost_model import PROFILES
from homeai.sim.simulator import Simulator
from homeai.sim.trace import TraceRequest

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(DEFAULT_POLICY)


def summarize(seq_id: int) -> Sequence:
    return Sequence(seq_id, f"s{seq_id}", [7] * 64, SamplingParams(temperature=0.0, max_tokens=8),
                    class_name="summarize", user="indexer")


def test_a_closed_background_window_never_holds_back_a_ready_search_batch(policy: Policy) -> None:
    clock = VirtualClock()
    sched = ClassScheduler(BlockManager(256, 16), policy, clock)
    batcher = Batcher(policy, sched, clock)
    batcher.push_embedding("embedding", QueuedItem("q0", "alice"))
    clock.set(batcher.next_wake_s() or 0.0)  # the search window closes (2 ms)
    first = batcher.take_next()
    assert isinstance(first, EmbedWork)
    batcher.record("embedding", clock.now(), clock.now() + 0.003, 1)
    clock.advance(0.003)
    sched.add(summarize(1))  # its window (50 ms) is closed: no LLM step could do anything
    batcher.push_embedding("embedding", QueuedItem("q1", "alice"))
    assert batcher.take_next() is None  # nothing is ready: neither the query nor an (empty) LLM step
    wake = batcher.next_wake_s(after=clock.now())
    assert wake is not None and wake > clock.now()  # an idle loop sleeps until then: no 0 s wait
    clock.set(wake)
    work = batcher.take_next()
    assert isinstance(work, EmbedWork) and [i.request_id for i in work.items] == ["q1"]


def test_the_simulator_completes_a_search_that_is_ready_while_summaries_wait(policy: Policy) -> None:
    trace = [TraceRequest(0.0, "summarize", "llm", "indexer", 64, 8),
             TraceRequest(0.001, "embedding", "embedding", "search", input_tokens=[12]),
             TraceRequest(0.006, "embedding", "embedding", "search", input_tokens=[12])]
    sim = Simulator(policy, PROFILES["gpu-8b"], lambda r: (r.class_name, None, r.user))
    result = sim.run(trace, horizon_s=2.0)
    searches = [r for r in result.records if r.req.class_name == "embedding"]
    assert len(searches) == 2
    for rec in searches:
        assert rec.done_s is not None, "the query never completed"
        # its 2 ms window plus one small batch: well before the summaries' 50 ms window closes
        assert rec.done_s - rec.req.arrival_s < 0.01
    assert all(r.done_s is not None for r in result.records)


def test_a_forced_background_batch_applies_timeouts_now_not_at_the_window_end() -> None:
    cp = ClassPolicy.model_validate({
        "kind": "embedding", "model": "m", "background": True, "min_share": 0.1, "max_batch_size": 64,
        "preferred_batch_size": [64], "max_queue_delay_microseconds": 50_000,
        "default_queue_policy": {"timeout_action": "REJECT", "default_timeout_microseconds": 20_000}})
    q = ClassQueue("indexing", cp)
    for i in range(3):
        q.push(QueuedItem(f"i{i}", "indexer"), 0.0)
    batch = q.form_batch(0.0, force=True)
    assert batch is not None and [i.request_id for i in batch] == ["i0", "i1", "i2"]
    assert q.expire(0.0) == []


def test_the_batcher_forces_a_starved_background_batch_without_expiring_it(policy: Policy) -> None:
    clock = VirtualClock()
    batcher = Batcher(policy, None, clock)
    cp = policy.classes["indexing"].model_copy(update={"default_queue_policy": policy.classes["indexing"]
                                                       .default_queue_policy.model_copy(update={
                                                           "timeout_action": "REJECT",
                                                           "default_timeout_microseconds": 20_000})})
    batcher.embed_queues["indexing"].set_policy(cp)
    for i in range(3):
        batcher.push_embedding("indexing", QueuedItem(f"i{i}", "indexer"))
    work = batcher._take("indexing", clock.now(), force=True)
    assert isinstance(work, EmbedWork) and len(work.items) == 3
    assert batcher.expire_embeddings() == []
