"""Hypothesis state machine: the device thread owns the scheduling state; other threads only post.

Real parts (DeviceLoop.run_once, LLMEngine's inbox and streams, EmbedService's inbox, Batcher,
ClassScheduler, class queues, BlockManager) on virtual time, with a fake runner and encoder. Adds,
aborts, cancels and policy swaps are posted from another thread, some of them while an LLM step runs
(the runner posts from a second thread in the middle of the step and waits for it: deterministic).
After every rule:

- every request is in exactly one place (an inbox, a queue, running, a pending timeout report) or has
  ended (its stream got its last delta or an error; every embedding input got a vector or an error);
- KV blocks are conserved and held only by running sequences;
- each step stays within the token budget, ``max_num_seqs`` and the classes' ``max_running``;
- an iteration with no work sleeps until the next deadline after now: never a 0 s wait.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable

import torch
from engine_helpers import FakeRunner
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams, StepOutput, StepPlan, TokenDelta
from homeai.engine.device_loop import IDLE_WAIT_S, DeviceLoop
from homeai.engine.embed_service import EmbedInput, EmbedService
from homeai.engine.llm_engine import LLMEngine
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import Batcher
from homeai.scheduling.class_queue import QueuedItem
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock

LLM_CLASSES = ["voice", "chat", "summarize"]
EMBED_CLASSES = ["search", "indexing"]
USERS = ["ann", "bob"]


def make_policy(budget: int, max_seqs: int, voice_running: int, chat_delay_us: int) -> Policy:
    text = f"""
classes:
  voice: {{kind: llm, model: m, priority: 0, max_batch_size: 4, max_queue_delay_microseconds: 0,
          max_running: {voice_running}, targets: {{ttft_ms: 300, itl_ms: 100}},
          default_queue_policy: {{max_queue_size: 4, timeout_action: REJECT,
                                  default_timeout_microseconds: 40000, allow_timeout_override: true}}}}
  chat: {{kind: llm, model: m, priority: 1, max_batch_size: 8, max_queue_delay_microseconds: {chat_delay_us},
         default_queue_policy: {{max_queue_size: 6, timeout_action: DELAY, default_timeout_microseconds: 30000}}}}
  summarize: {{kind: llm, model: m, priority: 2, background: true, min_share: 0.1, max_batch_size: 4,
              max_queue_delay_microseconds: 50000, max_running: 2,
              default_queue_policy: {{max_queue_size: 3, timeout_action: REJECT, default_timeout_microseconds: 60000}}}}
  search: {{kind: embedding, model: e, priority: 1, max_batch_size: 4, preferred_batch_size: [4],
           max_queue_delay_microseconds: 2000,
           default_queue_policy: {{max_queue_size: 5, timeout_action: REJECT, default_timeout_microseconds: 20000}}}}
  indexing: {{kind: embedding, model: e, priority: 2, background: true, min_share: 0.1, max_batch_size: 8,
             max_queue_delay_microseconds: 50000, default_queue_policy: {{max_queue_size: 12}}}}
scheduler: {{max_num_batched_tokens: {budget}, max_num_seqs: {max_seqs}}}
"""
    return parse_policy(text, source="ownership-test")


POLICIES = [make_policy(64, 4, 2, 2000), make_policy(32, 2, 1, 0), make_policy(128, 6, 4, 8000)]


def from_another_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` on a fresh thread and wait for it: a post from outside the device thread. What it
    raises is raised here."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]


class StepRunner(FakeRunner):
    """The fake runner, costing virtual time; ``during`` runs in the middle of a step (a post that
    lands while the device is busy), and every plan is checked against the budget and the caps."""

    def __init__(self, clock: VirtualClock, sched: ClassScheduler) -> None:
        super().__init__()
        self.clock, self.sched = clock, sched
        self.during: list[Callable[[], None]] = []  # posts held until the middle of the next step
        self.held: set[str] = set()  # request ids whose add is among them

    def execute(self, plan: StepPlan, seqs: dict[int, Sequence]) -> StepOutput:
        sched = self.sched
        assert plan.num_tokens <= sched.max_num_batched_tokens
        assert len(sched.running) <= sched.max_num_seqs
        for state in sched.classes.values():
            cap = state.policy.max_running
            assert cap is None or state.num_running <= cap, f"{state.name}: {state.num_running} > {cap}"
        self.post_held()
        self.clock.advance(0.004 + 0.0002 * plan.num_tokens)
        return super().execute(plan, seqs)

    def post_held(self) -> None:
        during, self.during = self.during, []
        for post in during:
            from_another_thread(post)
        self.held.clear()

    def release(self, seq_id: int) -> None:
        pass


class FakeEncoder:
    max_length = 64

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def embed(self, token_ids: list[list[int]]) -> torch.Tensor:
        self.clock.advance(0.002 + 0.0005 * len(token_ids))
        return torch.zeros(len(token_ids), 4)


class OwnershipMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock()
        self.aloop = asyncio.new_event_loop()  # the "HTTP side": stream queues and futures live here
        self.sched = ClassScheduler(BlockManager(40, 4), POLICIES[0], self.clock)
        self.runner = StepRunner(self.clock, self.sched)
        self.engine = LLMEngine(self.runner, self.sched, tokenizer=None, eos_token_ids=[], max_model_len=64)  # type: ignore[arg-type]
        self.batcher = Batcher(POLICIES[0], self.sched, self.clock)
        self.embed = EmbedService(self.batcher, {"e": FakeEncoder(self.clock)}, self.engine.wake)  # type: ignore[dict-item]
        self.device = DeviceLoop(llm=self.engine, batcher=self.batcher, embed=self.embed)
        self.streams: dict[str, asyncio.Queue[TokenDelta | Exception]] = {}
        self.seqs: dict[str, Sequence] = {}
        self.ended: set[str] = set()
        self.inputs: dict[str, list[QueuedItem]] = {}  # embedding request -> its inputs
        self.ids = itertools.count()

    def teardown(self) -> None:
        try:
            self.runner.post_held()  # no LLM step may come to post them
            for _ in range(2000):  # drain: every request must end, every block come back
                if self._all_ended():
                    break
                self._iterate()
            assert self._all_ended(), "requests never ended"
            bm = self.sched.block_manager
            assert bm.num_free_blocks == bm.num_blocks
        finally:
            self.aloop.close()

    # ---- helpers ---------------------------------------------------------------------------------
    def _settle(self) -> None:
        """Let the HTTP side's loop run the callbacks the device thread scheduled (deltas, vectors)."""
        self.aloop.call_soon(self.aloop.stop)
        self.aloop.run_forever()
        for items in self.inputs.values():  # the callers see their vectors or errors
            for it in items:
                if it.payload.future.done() and not it.payload.future.cancelled():
                    it.payload.future.exception()
        for rid, queue in self.streams.items():
            while not queue.empty():
                item = queue.get_nowait()
                if isinstance(item, Exception) or item.finished:
                    assert rid not in self.ended, f"{rid} ended twice"
                    self.ended.add(rid)

    def _iterate(self) -> None:
        """One device-loop iteration; with nothing to run, the loop's own idle wait, on virtual time."""
        did = self.device.run_once()
        self._settle()
        if not did:
            waits: list[float] = []
            now = self.clock.now()

            class Recorder:
                def wait(self, timeout: float) -> bool:
                    waits.append(timeout)
                    return False

            wake_event, self.device.wake = self.device.wake, Recorder()  # type: ignore[assignment]
            try:
                self.device._idle_wait()
            finally:
                self.device.wake = wake_event
            assert waits and waits[0] > 0, f"a 0 s idle wait at {now}: the loop would spin"
            wake = self.batcher.next_wake_s(after=now)
            # it sleeps until the next deadline (a window closing, a timeout), capped by IDLE_WAIT_S
            assert waits[0] == (IDLE_WAIT_S if wake is None else min(IDLE_WAIT_S, wake - now))
            self.clock.set(wake if wake is not None else now + 0.05)

    def _all_ended(self) -> bool:
        llm_done = all(rid in self.ended for rid in self.seqs)
        emb_done = all(it.payload.future.done() for items in self.inputs.values() for it in items)
        return llm_done and emb_done

    def _open_stream(self, rid: str) -> None:
        async def open_() -> asyncio.Queue[TokenDelta | Exception]:
            return self.engine.streams.open(rid)
        self.streams[rid] = self.aloop.run_until_complete(open_())

    # ---- rules: other threads post -----------------------------------------------------------------
    @rule(cls=st.sampled_from(LLM_CLASSES), user=st.sampled_from(USERS), prompt=st.integers(1, 40),
          max_tokens=st.integers(1, 8), timeout_us=st.sampled_from([None, 1000, 5000]),
          while_stepping=st.booleans())
    def post_llm(self, cls: str, user: str, prompt: int, max_tokens: int, timeout_us: int | None,
                 while_stepping: bool) -> None:
        n = next(self.ids)
        seq = Sequence(n, f"g{n}", [1 + (n + j) % 100 for j in range(prompt)],
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                       class_name=cls, user=user, timeout_us=timeout_us)
        self._open_stream(seq.request_id)
        self.seqs[seq.request_id] = seq
        post = lambda: self.engine.submit(seq)  # noqa: E731
        if while_stepping:
            self.runner.during.append(post)  # lands in the middle of the next LLM step
            self.runner.held.add(seq.request_id)
        else:
            from_another_thread(post)

    @rule(data=st.data(), while_stepping=st.booleans())
    @precondition(lambda self: self.seqs)
    def post_abort(self, data: st.DataObject, while_stepping: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.seqs)))
        post = lambda: self.engine.abort(rid)  # noqa: E731
        if while_stepping:
            self.runner.during.append(post)
        else:
            from_another_thread(post)

    @rule(cls=st.sampled_from(EMBED_CLASSES), user=st.sampled_from(USERS), n=st.integers(1, 5))
    def post_embedding(self, cls: str, user: str, n: int) -> None:
        rid = f"e{next(self.ids)}"
        items = [QueuedItem(f"{rid}/{k}", user, cost=4,
                            payload=EmbedInput([1, 2, 3, 4], self.aloop, self.aloop.create_future()))
                 for k in range(n)]
        self.inputs[rid] = items
        from_another_thread(lambda: self.embed.submit(cls, items))

    @rule(data=st.data())
    @precondition(lambda self: self.inputs)
    def cancel_embedding(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.inputs)))
        items = self.inputs[rid]
        cls = next(name for name, q in self.batcher.embed_queues.items() if items[0].request_id in q) \
            if any(items[0].request_id in q for q in self.batcher.embed_queues.values()) else EMBED_CLASSES[0]
        from_another_thread(lambda: self.embed.cancel(cls, items))
        for it in items:  # the caller went away: its futures are cancelled on its side
            it.payload.future.cancel()

    @rule(index=st.integers(0, len(POLICIES) - 1), while_stepping=st.booleans())
    def swap_policy(self, index: int, while_stepping: bool) -> None:
        post = lambda: self.device.post_policy(POLICIES[index])  # noqa: E731
        if while_stepping:
            self.runner.during.append(post)
        else:
            from_another_thread(post)

    # ---- rules: the device thread ------------------------------------------------------------------
    @rule(times=st.integers(1, 4))
    def iterate(self, times: int) -> None:
        for _ in range(times):
            self._iterate()

    @rule(dt_ms=st.integers(0, 30))
    def time_passes(self, dt_ms: int) -> None:
        self.clock.advance(dt_ms / 1000)

    # ---- invariants ------------------------------------------------------------------------------
    @invariant()
    def every_request_is_in_exactly_one_place_or_ended(self) -> None:
        with self.engine._inbox_lock:
            posted = {item.request_id for kind, item in self.engine._inbox if kind == "add"}
        for rid, seq in self.seqs.items():
            places = [rid in posted or rid in self.runner.held,  # posted, or about to be mid-step
                      any(rid in s.queue for s in self.sched.classes.values()),
                      seq in self.sched.running, seq in self.sched.rejected, rid in self.ended]
            assert sum(places) == 1, f"{rid}: inbox, queue, running, rejected, ended = {places}"
        with self.embed._inbox_lock:
            posted_inputs = {it.request_id for kind, _c, items in self.embed._inbox if kind == "push"
                             for it in items}
        expired = {it.request_id for _c, it in self.batcher._expired}
        for items in self.inputs.values():
            for it in items:
                places = [it.request_id in posted_inputs,
                          any(it.request_id in q for q in self.batcher.embed_queues.values()),
                          it.request_id in expired, it.payload.future.done()]
                assert sum(places) >= 1, f"{it.request_id} vanished"
                # a cancelled caller's input may still sit in a queue until the cancel is applied
                assert sum(places[:3]) <= 1, f"{it.request_id} is in two places: {places}"

    @invariant()
    def kv_blocks_are_conserved_and_held_by_running_sequences_only(self) -> None:
        bm = self.sched.block_manager
        bm.check_conserved()
        held = sum(len(bm.block_table(s.seq_id)) for s in self.sched.running)
        assert held == bm.num_blocks - bm.num_free_blocks


TestOwnershipMachine = OwnershipMachine.TestCase
TestOwnershipMachine.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)


async def test_a_request_with_more_inputs_than_its_queue_holds_is_embedded() -> None:
    """A request is queued when its first input finds room, and brings all its inputs: counted input by
    input, a request of 6 inputs to a queue of 5 got a 429 on an idle device however often it retried.
    While its inputs fill the queue, other requests still get the 429."""
    clock = VirtualClock()
    batcher = Batcher(make_policy(64, 6, 4, 0), None, clock)  # search: max_queue_size 5, batches of 4
    service = EmbedService(batcher, {"e": FakeEncoder(clock)})  # type: ignore[dict-item]
    loop = DeviceLoop(llm=None, batcher=batcher, embed=service)

    async def serve(*requests: asyncio.Future[object]) -> list[str]:
        await asyncio.sleep(0)
        for _ in range(40):
            loop.run_once()
            clock.advance(0.01)
            await asyncio.sleep(0)
        return [type(r.exception()).__name__ if r.exception() else "ok" for r in requests]

    big = asyncio.ensure_future(service.embed("search", [[1, 2, 3]] * 6))
    await asyncio.sleep(0)
    loop.apply_inbox()
    other = asyncio.ensure_future(service.embed("search", [[4, 5]]))
    assert await serve(big, other) == ["ok", "QueueFullError"]
    assert big.result().vectors.shape == (6, 4)
    assert await serve(asyncio.ensure_future(service.embed("search", [[4, 5]]))) == ["ok"]
