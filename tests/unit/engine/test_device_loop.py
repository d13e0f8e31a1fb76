"""The device loop owns the scheduling state (other threads touching it raced with the planner): other
threads post, the loop applies.

On the real DeviceLoop: a summary waiting behind its closed delay window no longer turns a
ready search batch into an empty LLM step and a 0 s idle wait. Requests reach the scheduler only through
the loop's thread; a full queue's refusal reaches the caller where it awaits its first delta; a policy
swap posted before a request is applied before it. Virtual time throughout.
"""

from __future__ import annotations

import asyncio

import pytest
from test_device_ownership import FakeEncoder, StepRunner, make_policy

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams
from homeai.engine.device_loop import DeviceLoop
from homeai.engine.embed_service import EmbedInput, EmbedService
from homeai.engine.llm_engine import LLMEngine
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import Batcher
from homeai.scheduling.class_queue import QueuedItem, QueueFullError
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock


class LetterTokenizer:
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in token_ids)


class Rig:
    """A device loop with the real engine, embedding service, batcher and class scheduler; the test's
    thread plays the device thread by calling ``run_once`` (no loop thread is started)."""

    def __init__(self, policy: Policy, aloop: asyncio.AbstractEventLoop) -> None:
        self.clock = VirtualClock()
        self.aloop = aloop
        self.sched = ClassScheduler(BlockManager(40, 4), policy, self.clock)
        self.engine = LLMEngine(StepRunner(self.clock, self.sched), self.sched, LetterTokenizer(), [], 64)
        self.batcher = Batcher(policy, self.sched, self.clock)
        self.embed = EmbedService(self.batcher, {"e": FakeEncoder(self.clock)}, self.engine.wake)  # type: ignore[dict-item]
        self.loop = DeviceLoop(llm=self.engine, batcher=self.batcher, embed=self.embed)

    def search(self, rid: str) -> QueuedItem:
        item = QueuedItem(rid, "alice", payload=EmbedInput([1, 2, 3], self.aloop, self.aloop.create_future()))
        self.embed.submit("search", [item])
        return item

    def summary(self, n: int) -> Sequence:
        seq = Sequence(n, f"s{n}", [5] * 12, SamplingParams(temperature=0.0, max_tokens=4),
                       class_name="summarize", user="indexer")
        self.engine.submit(seq)
        return seq


def idle_timeout(loop: DeviceLoop) -> float:
    waits: list[float] = []

    class Recorder:
        def wait(self, timeout: float) -> bool:
            waits.append(timeout)
            return False

    event, loop.wake = loop.wake, Recorder()  # type: ignore[assignment]
    try:
        loop._idle_wait()
    finally:
        loop.wake = event
    return waits[0]


def test_a_waiting_summary_neither_blocks_a_ready_search_nor_makes_the_loop_spin() -> None:
    aloop = asyncio.new_event_loop()
    try:
        rig = Rig(make_policy(64, 4, 2, 2000), aloop)
        rig.search("q0")
        assert rig.loop.run_once() is False  # queued; its 2 ms window is open
        rig.clock.set(rig.batcher.next_wake_s() or 0.0)
        assert rig.loop.run_once() is True  # the first search batch
        rig.summary(1)  # its 50 ms window: no LLM step could do anything before then
        rig.search("q1")
        assert rig.loop.run_once() is False
        assert idle_timeout(rig.loop) == pytest.approx(0.002)  # until the search window closes, not 0
        rig.clock.advance(0.002)
        assert rig.loop.run_once() is True
        assert rig.sched.num_waiting == 1 and len(rig.batcher.embed_queues["search"]) == 0  # q1 ran
        assert idle_timeout(rig.loop) > 0
    finally:
        aloop.close()


async def test_a_full_queue_refuses_through_the_stream_and_only_the_device_thread_queues() -> None:
    rig = Rig(make_policy(64, 4, 2, 2000), asyncio.get_running_loop())
    params = SamplingParams(temperature=0.0, max_tokens=2)
    streams = [rig.engine.generate([1, 2, 3], params, f"v{i}", class_name="voice", user="kid") for i in range(12)]
    firsts = [asyncio.ensure_future(anext(s)) for s in streams]
    await asyncio.sleep(0)
    assert rig.sched.num_waiting == 0  # posted: this thread never touched the scheduler
    rig.loop.run_once()  # the device thread queues what fits (max_queue_size 4) and refuses the rest
    await asyncio.wait(firsts[-1:], timeout=1)
    refused = [f for f in firsts if f.done() and isinstance(f.exception(), QueueFullError)]
    assert firsts[-1] in refused
    for _ in range(40):
        rig.loop.run_once()
        await asyncio.sleep(0)
    served = [f for f in firsts if f not in refused]
    assert served and all(f.done() and f.result().num_output_tokens >= 1 for f in served)
    for s in streams:
        await s.aclose()
    rig.loop.run_once()
    assert not rig.sched.seqs


async def test_one_user_filling_a_queue_is_pushed_out_for_another_users_request() -> None:
    """Found by a security review: a kid's key kept voice's queue full, and alice's voice request got 429 at
    once for as long as the kid went on (fairness chose only who was taken next). Now the kid's newest
    queued request gets the 429 and alice's is queued."""
    rig = Rig(make_policy(64, 4, 2, 2000), asyncio.get_running_loop())
    params = SamplingParams(temperature=0.0, max_tokens=2)
    kid = [rig.engine.generate([1, 2, 3], params, f"k{i}", class_name="voice", user="kid") for i in range(12)]
    kid_firsts = [asyncio.ensure_future(anext(s)) for s in kid]
    await asyncio.sleep(0)
    rig.loop.run_once()
    await asyncio.wait(kid_firsts[-1:], timeout=1)
    refused = {i for i, f in enumerate(kid_firsts) if f.done() and isinstance(f.exception(), QueueFullError)}
    queued = [i for i in range(12) if i not in refused]
    alice = rig.engine.generate([1, 2, 3], params, "a0", class_name="voice", user="alice")
    alice_first = asyncio.ensure_future(anext(alice))
    await asyncio.sleep(0)
    for _ in range(40):
        rig.loop.run_once()
        await asyncio.sleep(0)
    assert alice_first.done() and alice_first.result().num_output_tokens >= 1, alice_first
    newest = kid_firsts[queued[-1]]
    assert newest.done() and isinstance(newest.exception(), QueueFullError)  # the kid's newest: a 429
    assert all(kid_firsts[i].done() and kid_firsts[i].exception() is None for i in queued[:-1])
    for s in [*kid, alice]:
        await s.aclose()


def test_a_policy_swap_posted_first_is_applied_before_a_later_request() -> None:
    aloop = asyncio.new_event_loop()
    try:
        rig = Rig(make_policy(64, 4, 2, 2000), aloop)
        rig.loop.post_policy(make_policy(32, 2, 1, 0))  # chat: no delay window any more
        seq = Sequence(1, "c1", [5] * 6, SamplingParams(temperature=0.0, max_tokens=1), class_name="chat", user="u")
        rig.engine.submit(seq)
        assert rig.sched.max_num_seqs == 4  # nothing applied from the posting thread
        assert rig.loop.run_once() is True  # swap, then the request: admitted at once, no 2 ms wait
        assert rig.sched.max_num_seqs == 2 and seq.status.is_finished
    finally:
        aloop.close()


async def test_the_first_delta_after_admission_says_how_long_the_request_queued() -> None:
    """Chat holds its prompts for its 2 ms delay window: the first delta carries that wait (the metrics'
    homeai_queue_seconds and the request log's queue_ms), the later ones none."""
    rig = Rig(make_policy(64, 4, 2, 2000), asyncio.get_running_loop())
    stream = rig.engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), "c",
                                 class_name="chat", user="ann")
    deltas = []
    reading = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    for _ in range(200):
        if reading.done():
            deltas.append(reading.result())
            if deltas[-1].finished:
                break
            reading = asyncio.ensure_future(anext(stream))
        elif not rig.loop.run_once():
            rig.clock.advance(0.0005)
        await asyncio.sleep(0)
    await stream.aclose()
    assert deltas[-1].finished and len(deltas) >= 2
    assert deltas[0].queue_s == pytest.approx(0.002, abs=0.0006)
    assert all(d.queue_s is None for d in deltas[1:])
