"""One failure stays one failure: a step, a batch or a model lookup that raises ends only its own requests.

The real engine (tiny random Llama behind the real ModelRunner), class scheduler, batcher, embedding
service and device loop on virtual time; failures are injected where the device can raise: the runner
on chosen sequences, the encoder, and the embedding service's model lookup. Every other request
finishes as if nothing happened, the failed ones end with an error naming the cause, no future is left
waiting, and the loop's health counts what failed.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import LetterTokenizer, build_tiny_engine
from test_device_ownership import FakeEncoder, make_policy

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams, StepOutput, StepPlan, TokenDelta
from homeai.engine.device_loop import DeviceLoop
from homeai.engine.embed_service import EmbedBatchError, EmbedInput, EmbedService
from homeai.engine.errors import ClassRetiredError
from homeai.engine.health import FAILING_AFTER
from homeai.engine.llm_engine import LLMEngine
from homeai.engine.model_runner import ModelRunner
from homeai.policy.schema import Policy
from homeai.runtime.llama import LlamaModel
from homeai.scheduling.batcher import Batcher
from homeai.scheduling.class_queue import QueuedItem
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock


class PoisonedRunner:
    """The real runner, except that any step holding a poisoned request raises (as a shape bug would)."""

    def __init__(self, runner: ModelRunner, clock: VirtualClock) -> None:
        self.runner, self.clock = runner, clock
        self.poisoned: set[str] = set()
        self.transient_failures = 0  # the next this many steps raise whatever they hold
        self.calls = 0

    def execute(self, plan: StepPlan, seqs: dict[int, Sequence]) -> StepOutput:
        self.calls += 1
        self.clock.advance(0.005)
        if self.transient_failures > 0:
            self.transient_failures -= 1
            raise RuntimeError("transient device error")
        if any(seqs[c.seq_id].request_id in self.poisoned for c in plan.chunks if c.seq_id in seqs):
            raise RuntimeError("cannot reshape tensor of 0 elements into shape [0, -1]")
        return self.runner.execute(plan, seqs)

    def release(self, seq_id: int) -> None:
        self.runner.release(seq_id)


class BrokenEncoder(FakeEncoder):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock)
        self.fail = False

    def embed(self, token_ids: list[list[int]]) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("encoder out of memory")
        return super().embed(token_ids)


class Rig:
    def __init__(self, model: LlamaModel, aloop: asyncio.AbstractEventLoop, prefix_caching: bool = False) -> None:
        self.clock = VirtualClock()
        self.aloop = aloop
        policy = make_policy(64, 6, 4, 0)
        self.sched = ClassScheduler(BlockManager(64, 4, enable_prefix_caching=prefix_caching), policy, self.clock)
        tiny = build_tiny_engine(model, num_blocks=64, block_size=4)
        runner = ModelRunner(model, tiny.runner.cache)
        self.runner = PoisonedRunner(runner, self.clock)
        self.engine = LLMEngine(self.runner, self.sched, LetterTokenizer(), [], 256)  # type: ignore[arg-type]
        self.batcher = Batcher(policy, self.sched, self.clock)
        self.encoder = BrokenEncoder(self.clock)
        self.embed = EmbedService(self.batcher, {"e": self.encoder}, self.engine.wake)  # type: ignore[dict-item]
        self.loop = DeviceLoop(llm=self.engine, batcher=self.batcher, embed=self.embed)

    def run(self, steps: int = 200) -> None:
        for _ in range(steps):
            if not self.loop.run_once():
                self.clock.advance(0.01)

    def search(self, rid: str) -> QueuedItem:
        item = QueuedItem(rid, "ann", payload=EmbedInput([1, 2, 3], self.aloop, self.aloop.create_future()))
        self.embed.submit("search", [item])
        return item


async def collect(stream: object) -> list[TokenDelta]:
    return [d async for d in stream]  # type: ignore[attr-defined]


def params(n: int = 6) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


async def test_a_poisoned_request_fails_alone_and_its_batch_mates_finish(tiny_model: LlamaModel) -> None:
    rig = Rig(tiny_model, asyncio.get_running_loop())
    rig.runner.poisoned.add("bad")
    names = ["v1", "v2", "bad", "c1", "c2"]
    classes = {"v1": "voice", "v2": "voice", "bad": "chat", "c1": "chat", "c2": "summarize"}
    tasks = {n: asyncio.ensure_future(collect(rig.engine.generate([3, 4, 5, 6, 7], params(), n,
                                                                   class_name=classes[n], user="ann")))
             for n in names}
    await asyncio.sleep(0)
    for _ in range(60):
        rig.run(5)
        await asyncio.sleep(0)
        if all(t.done() for t in tasks.values()):
            break
    results = {n: t.result() for n, t in tasks.items()}
    bad = results.pop("bad")
    assert bad[-1].error is not None and "cannot reshape" in bad[-1].error and bad[-1].finished
    for name, deltas in results.items():
        assert deltas[-1].error is None, name
        assert deltas[-1].num_output_tokens == 6, name  # as if nothing had happened
    assert not rig.sched.seqs and rig.sched.block_manager.num_free_blocks == rig.sched.block_manager.num_blocks
    assert rig.engine.health.errors[("llm_step", "RuntimeError")] >= 2
    assert not rig.engine.health.failing  # the others' steps succeeded after it


async def test_a_transient_failure_is_retried_and_nobody_fails(tiny_model: LlamaModel) -> None:
    rig = Rig(tiny_model, asyncio.get_running_loop())
    tasks = [asyncio.ensure_future(collect(rig.engine.generate([3, 4, 5], params(4), f"r{i}", class_name="chat",
                                                                user="ann"))) for i in range(3)]
    await asyncio.sleep(0)
    rig.run(3)  # admitted and running
    rig.runner.transient_failures = 1  # the next step raises once; each sequence alone then succeeds
    for _ in range(40):
        rig.run(5)
        await asyncio.sleep(0)
        if all(t.done() for t in tasks):
            break
    for t in tasks:
        deltas = t.result()
        assert deltas[-1].error is None and deltas[-1].num_output_tokens == 4


async def test_a_failing_embedding_batch_fails_that_batch_only(tiny_model: LlamaModel) -> None:
    rig = Rig(tiny_model, asyncio.get_running_loop())
    chat = asyncio.ensure_future(collect(rig.engine.generate([3, 4, 5], params(8), "c", class_name="chat",
                                                              user="ann")))
    await asyncio.sleep(0)
    rig.run(2)
    rig.encoder.fail = True
    first = [rig.search(f"q{i}") for i in range(4)]  # one preferred batch of 4
    rig.run(3)
    await asyncio.sleep(0)
    for it in first:
        assert it.payload.future.done()
        with pytest.raises(EmbedBatchError, match="encoder out of memory"):
            it.payload.future.result()
    rig.encoder.fail = False
    second = [rig.search(f"r{i}") for i in range(4)]
    for _ in range(40):
        rig.run(5)
        await asyncio.sleep(0)
        if chat.done() and all(it.payload.future.done() for it in second):
            break
    assert all(it.payload.future.result().shape == (4,) for it in second)
    assert chat.result()[-1].error is None and chat.result()[-1].num_output_tokens == 8  # the LLM never noticed
    assert rig.embed.health.errors[("embed_batch", "RuntimeError")] == 1


async def test_a_model_lookup_that_raises_answers_every_caller(tiny_model: LlamaModel,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(tiny_model, asyncio.get_running_loop())
    items = [rig.search(f"q{i}") for i in range(4)]

    def lookup_fails(*_args: object) -> None:
        raise KeyError("the class's model vanished in a swap")

    monkeypatch.setattr(rig.embed, "model_for", lookup_fails)
    rig.run(3)
    await asyncio.sleep(0)
    assert all(it.payload.future.done() and isinstance(it.payload.future.exception(), EmbedBatchError)
               for it in items)  # nobody waits forever


async def run_until_failing(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The device thread's own loop for FAILING_AFTER iterations; each failure is followed by an idle wait
    (recorded, not slept: never a spin). Returns the waits."""
    waits: list[float] = []
    monkeypatch.setattr(rig.loop, "_idle_wait", lambda: waits.append(1.0))
    monkeypatch.setattr(rig.loop._stop, "is_set", lambda: len(waits) >= FAILING_AFTER)
    rig.loop._run()
    await asyncio.sleep(0)  # the answers are delivered on the event loop
    return waits


async def test_a_loop_that_keeps_failing_outside_steps_ends_requests_and_is_not_ready(
        tiny_model: LlamaModel, monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(tiny_model, asyncio.get_running_loop())
    task = asyncio.ensure_future(collect(rig.engine.generate([3, 4, 5], params(), "c", class_name="chat", user="ann")))
    await asyncio.sleep(0)

    def schedule_fails() -> StepPlan:
        raise ValueError("planner bug")

    monkeypatch.setattr(rig.sched, "schedule", schedule_fails)
    waits = await run_until_failing(rig, monkeypatch)
    assert len(waits) == FAILING_AFTER and rig.loop.health.failing
    deltas = await asyncio.wait_for(task, 1)
    assert deltas[-1].error is not None and "planner bug" in deltas[-1].error


async def test_a_loop_that_keeps_failing_answers_embedding_callers_and_rejected_requests_too(
        tiny_model: LlamaModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its last resort ended the LLMs' running and queued sequences only: an embedding input in a class
    queue or still posted, and a request the scheduler had rejected (a swap retired its class), waited on."""
    rig = Rig(tiny_model, asyncio.get_running_loop())
    chat = asyncio.ensure_future(collect(rig.engine.generate([3, 4, 5], params(), "c", class_name="chat", user="ann")))
    await asyncio.sleep(0)
    queued = rig.search("q0")
    rig.loop.apply_inbox()  # the chat request and the search input are queued
    posted = rig.search("q1")  # still posted when the loop breaks
    without_chat = rig.batcher.policy.model_dump()
    del without_chat["classes"]["chat"]
    rig.loop.post_policy(Policy.model_validate(without_chat))  # the chat request is rejected: a step publishes it

    def take_next_fails() -> None:
        raise ValueError("batcher bug")

    monkeypatch.setattr(rig.batcher, "take_next", take_next_fails)
    await run_until_failing(rig, monkeypatch)
    assert rig.loop.health.failing
    with pytest.raises(ClassRetiredError, match="class 'chat' was removed by a policy change"):
        await asyncio.wait_for(chat, 1)  # raised at its caller (a 503), as the scheduler's refusals are
    for item in (queued, posted):
        assert item.payload.future.done(), item.request_id
        with pytest.raises(EmbedBatchError, match="engine error: ValueError: batcher bug"):
            item.payload.future.result()


async def test_a_failed_step_that_copied_a_cached_prefix_leaves_the_cache_whole(tiny_model: LlamaModel) -> None:
    """The poisoned request's prefix ends inside a cached block, so its step first copies the common slots
    (``ScheduledChunk.kv_copy``, its source pinned) and then raises. The copy's source is released, every
    block comes back, and the same prompt served afterwards gives what a cold engine gives."""
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # blocks of 4: two whole (published), a tail of 2
    diverging = prompt[:6] + [20, 21, 22]  # the cache covers 6 tokens: one block and 2 slots of the next

    async def serve(rig: Rig, name: str, tokens: list[int]) -> list[TokenDelta]:
        task = asyncio.ensure_future(collect(rig.engine.generate(tokens, params(), name, class_name="chat",
                                                                  user="ann")))
        for _ in range(60):
            rig.run(5)
            await asyncio.sleep(0)
            if task.done():
                break
        return task.result()

    cold = await serve(Rig(tiny_model, asyncio.get_running_loop()), "cold", diverging)
    rig = Rig(tiny_model, asyncio.get_running_loop(), prefix_caching=True)
    await serve(rig, "first", prompt)
    copies: list[object] = []
    execute = rig.runner.execute

    def spying(plan: StepPlan, seqs: dict[int, Sequence]) -> StepOutput:
        copies.extend(c.kv_copy for c in plan.chunks if c.kv_copy is not None)
        return execute(plan, seqs)

    rig.runner.execute = spying  # type: ignore[method-assign]
    rig.runner.poisoned.add("bad")
    bad = await serve(rig, "bad", diverging)
    assert copies, "the poisoned step did not copy a cached prefix: the test lost its point"
    assert bad[-1].error is not None and "cannot reshape" in bad[-1].error
    bm = rig.sched.block_manager
    assert not bm._pins and bm.num_free_blocks == bm.num_blocks  # nothing held, nothing leaked
    again = await serve(rig, "again", diverging)
    assert again[-1].error is None
    assert [t for d in again for t in d.token_ids] == [t for d in cold for t in d.token_ids]


async def test_the_last_resort_answers_every_stream_even_when_ending_one_raises(tiny_model: LlamaModel) -> None:
    """fail_all ended the sequences in one comprehension and published after it: when ending one raised,
    those ended before it were out of the scheduler with no answer, their streams open for good."""
    rig = Rig(tiny_model, asyncio.get_running_loop())
    tasks = [asyncio.ensure_future(collect(rig.engine.generate([3, 4, 5], params(50), f"r{i}", class_name="chat",
                                                                user="ann"))) for i in range(3)]
    await asyncio.sleep(0)
    rig.run(3)
    assert len(rig.sched.seqs) == 3
    release, broken = rig.runner.release, max(s.seq_id for s in rig.sched.seqs.values())

    def release_fails(seq_id: int) -> None:
        if seq_id == broken:
            raise RuntimeError("matcher state corrupt")
        release(seq_id)

    rig.runner.release = release_fails  # type: ignore[method-assign]
    rig.engine.fail_all("engine error: loop broken")
    done, _ = await asyncio.wait(tasks, timeout=5)
    assert len(done) == 3
    outcomes = sorted("raised" if t.exception() else t.result()[-1].error or "" for t in tasks)
    assert outcomes == ["engine error: loop broken", "engine error: loop broken", "raised"]


async def test_a_step_that_fails_after_sampling_leaves_seeded_answers_as_they_were(tiny_model: LlamaModel) -> None:
    """A step that raised after its noise was drawn ran its sequences again alone, and each seeded
    generator had moved on: the same seed gave another answer than without the failure."""
    seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)

    async def answers(fail_once: bool) -> list[list[int]]:
        rig = Rig(tiny_model, asyncio.get_running_loop())
        sampler, failures = rig.runner.runner.sampler, [fail_once]

        def sample_then_fail(*args: object, **kwargs: object) -> object:
            out = type(sampler).sample(sampler, *args, **kwargs)  # type: ignore[arg-type]
            if failures[0]:
                failures[0] = False
                raise RuntimeError("the device failed after sampling")
            return out

        sampler.sample = sample_then_fail  # type: ignore[method-assign]
        tasks = [asyncio.ensure_future(collect(rig.engine.generate([3, 4, 5 + i], seeded, f"r{i}",
                                                                    class_name="chat", user="ann")))
                 for i in range(2)]
        for _ in range(60):
            await asyncio.sleep(0)
            rig.run(5)
            if all(t.done() for t in tasks):
                break
        return [[tok for d in t.result() for tok in d.token_ids] for t in tasks]

    assert await answers(fail_once=True) == await answers(fail_once=False)
