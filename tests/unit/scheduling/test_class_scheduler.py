"""The class-aware step planner on virtual time with the fake runner: priority preemption (slots and KV),
chunked prefill beside running decodes, the step limits, per-class max_running, background min_share,
the class delay window, VTC admission and its bound, queue timeouts, aborts, and policy swaps.

Every test ends with every KV block back in the pool (``assert_engine_empty``); every step checks the
plan against the limits and block conservation. Token identity against the real model after a
preemption is covered by the engine tests; here the fake runner samples the same token every time.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
import yaml
from engine_helpers import FAKE_TOKEN, FakeRunner, assert_engine_empty, make_requests

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import ScheduledChunk, StepPlan
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.scheduling.class_scheduler import INTERACTIVE_HORIZON_S, ClassScheduler
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.step_budget import StepCostModel

US = 1e-6
SHARE_WINDOW_STEPS = 64  # steps over which the min_share test measures the background's share


def make_policy(budget: int = 64, max_num_seqs: int = 8, **classes: dict[str, Any]) -> Policy:
    """voice (0) > chat (1) > summarize (2, background), LLM classes of one model; ``classes`` override
    or add fields per class (e.g. ``chat={"max_running": 2}``)."""
    fields: dict[str, dict[str, Any]] = {"voice": {"priority": 0}, "chat": {"priority": 1},
                                         "summarize": {"priority": 2, "background": True}}
    for name, extra in classes.items():
        fields[name] = {**fields.get(name, {}), **extra}
    doc = {"classes": {name: {"kind": "llm", "model": "m", **f} for name, f in fields.items()},
           "scheduler": {"max_num_batched_tokens": budget, "max_num_seqs": max_num_seqs}}
    return parse_policy(yaml.safe_dump(doc), source="test-policy")


def check_plan(sched: ClassScheduler, plan: StepPlan) -> None:
    """What every plan must satisfy, whatever happened before it."""
    assert plan.num_tokens <= sched.max_num_batched_tokens
    ids = [c.seq_id for c in plan.chunks]
    assert len(ids) == len(set(ids)) and not set(ids) & set(plan.preempted)
    assert len(ids) <= sched.max_num_seqs and sched.num_running <= sched.max_num_seqs
    for name, state in sched.classes.items():
        assert state.num_running == sum(s.class_name == name for s in sched.running)
        cap = state.policy.max_running
        assert cap is None or state.num_running <= cap, f"{name}: {state.num_running} running > {cap}"


class Harness:
    """A ClassScheduler on a VirtualClock driven by the fake runner; every step is checked."""

    def __init__(self, policy: Policy, num_blocks: int = 256, block_size: int = 4) -> None:
        self.clock = VirtualClock()
        self.bm = BlockManager(num_blocks, block_size)
        self.sched = ClassScheduler(self.bm, policy, self.clock)
        self.runner = FakeRunner()
        self.plans: list[StepPlan] = []
        self._ids = itertools.count()

    def add(self, class_name: str, user: str = "u", prompt_len: int = 8, max_tokens: int = 4,
            **extra: Any) -> Sequence:
        (seq,) = make_requests(1, prompt_len, max_tokens, first_id=next(self._ids))
        seq.class_name, seq.user = class_name, user
        for name, value in extra.items():  # typed request fields: priority_level, timeout_us
            setattr(seq, name, value)
        self.sched.add(seq)
        return seq

    def step(self, dt_s: float = 0.01) -> StepPlan:
        """Plan, check, execute, apply; then ``dt_s`` of virtual time passes."""
        plan = self.sched.schedule()
        check_plan(self.sched, plan)
        self.plans.append(plan)
        self.sched.update(plan, self.runner.execute(plan, self.sched.seqs))
        self.bm.check_conserved()
        self.clock.advance(dt_s)
        return plan

    def drain(self, max_steps: int = 5000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work():
                return
            self.step()
            self.sched.drain_rejected()
        raise AssertionError("scheduler still has work")

    def first_step(self, seq: Sequence) -> int:
        """Index of the first plan that ran a chunk of ``seq``."""
        return next(i for i, p in enumerate(self.plans) if any(c.seq_id == seq.seq_id for c in p.chunks))

    def ran(self, seq: Sequence) -> bool:
        return any(c.seq_id == seq.seq_id for p in self.plans for c in p.chunks)


def chunk_of(plan: StepPlan, seq: Sequence) -> ScheduledChunk | None:
    return next((c for c in plan.chunks if c.seq_id == seq.seq_id), None)


def tokens_of(plan: StepPlan, seq: Sequence) -> int:
    chunk = chunk_of(plan, seq)
    return chunk.num_tokens if chunk is not None else 0


def abort_all(sched: ClassScheduler) -> None:
    for seq in list(sched.seqs.values()):
        sched.abort(seq.request_id)


def assert_completed(*seqs: Sequence) -> None:
    for s in seqs:
        assert s.status == SequenceStatus.FINISHED_LENGTH, (s.request_id, s.status)
        assert s.output_token_ids == [FAKE_TOKEN] * s.params.max_tokens


# ---- priority preemption ---------------------------------------------------------------------------
def test_voice_takes_a_sequence_slot_from_the_least_important_running_sequence() -> None:
    h = Harness(make_policy(max_num_seqs=3))
    chat = h.add("chat", max_tokens=30)
    s1, s2 = h.add("summarize", max_tokens=30), h.add("summarize", max_tokens=30)
    h.step()
    h.step()
    assert h.sched.num_running == 3
    voice = h.add("voice", max_tokens=4)
    plan = h.step()
    assert plan.preempted == [s2.seq_id]  # the newest of the least important class
    assert {c.seq_id for c in plan.chunks} == {chat.seq_id, s1.seq_id, voice.seq_id}
    assert s2.status == SequenceStatus.PREEMPTED and s2.num_computed_tokens == 0
    assert h.bm.block_table(s2.seq_id) == []
    produced = s2.num_output_tokens
    h.drain()
    assert_completed(chat, s1, s2, voice)
    assert (s2.num_preemptions, chat.num_preemptions, s1.num_preemptions) == (1, 0, 0)
    back = next(c for p in h.plans[3:] if (c := chunk_of(p, s2)) is not None)
    assert back.start == 0 and back.num_tokens == 8 + produced  # recomputes prompt + its output
    assert_engine_empty(h.sched)


def test_voice_takes_kv_blocks_from_the_background_class() -> None:
    h = Harness(make_policy(), num_blocks=12, block_size=4)
    chat = h.add("chat", prompt_len=15, max_tokens=2)
    s0, s1 = (h.add("summarize", prompt_len=15, max_tokens=2) for _ in range(2))
    h.step()
    assert h.bm.num_free_blocks == 0  # 3 x 4 blocks: the pool is full
    voice = h.add("voice", prompt_len=8, max_tokens=3)
    plan = h.step()
    assert plan.preempted == [s1.seq_id]  # one victim frees enough; chat is never touched
    assert chunk_of(plan, voice) is not None and chunk_of(plan, chat) is not None
    h.drain()
    assert_completed(chat, s0, s1, voice)
    assert_engine_empty(h.sched)


def test_less_important_work_never_preempts_more_important_work() -> None:
    h = Harness(make_policy(max_num_seqs=2))
    v0, c0 = h.add("voice", max_tokens=12), h.add("chat", max_tokens=12)
    h.step()
    s0, c1 = h.add("summarize"), h.add("chat")
    for _ in range(3):
        assert not h.step().preempted  # chat waits for chat and voice, summarize for everyone
    assert set(h.sched.running) == {v0, c0}
    v1 = h.add("voice")
    assert h.step().preempted == [c0.seq_id]  # the least important running sequence, never v0
    h.drain()
    assert [sid for p in h.plans for sid in p.preempted] == [c0.seq_id]
    assert h.first_step(c1) < h.first_step(s0)  # freed slots go to chat before the background
    assert_completed(v0, c0, s0, c1, v1)
    assert_engine_empty(h.sched)


def test_a_preempted_request_is_not_failed_by_its_queue_timeout() -> None:
    """The queue timeout bounds waiting before service; a request that already streamed tokens and
    was preempted must complete, not be rejected as a queue timeout when it goes back in line."""
    reject_fast = {"default_queue_policy": {"timeout_action": "REJECT", "default_timeout_microseconds": 100_000}}
    h = Harness(make_policy(max_num_seqs=1, chat=reject_fast))
    chat = h.add("chat", max_tokens=40)
    for _ in range(20):  # 0.2 s: well past chat's 0.1 s queue timeout
        h.step()
    h.add("voice", max_tokens=3)
    assert h.step().preempted == [chat.seq_id]
    h.drain()
    assert chat.error is None
    assert_completed(chat)
    assert_engine_empty(h.sched)


# ---- chunked prefill and step limits ---------------------------------------------------------------
@pytest.mark.parametrize(("decode_class", "prompt_class"),
                         [("voice", "chat"), ("chat", "summarize"), ("chat", "voice"), ("chat", "chat")])
def test_running_decodes_get_a_token_every_step_while_a_long_prompt_prefills(decode_class: str,
                                                                           prompt_class: str) -> None:
    h = Harness(make_policy(budget=32))
    decoders = [h.add(decode_class, prompt_len=4, max_tokens=60) for _ in range(3)]
    h.step()
    long_seq = h.add(prompt_class, prompt_len=200, max_tokens=2)
    covered, steps = 0, 0
    while long_seq.num_computed_tokens < 200:
        before = [s.num_output_tokens for s in decoders]
        plan = h.step()
        steps += 1
        assert [s.num_output_tokens for s in decoders] == [b + 1 for b in before]  # never waits a step
        chunk = chunk_of(plan, long_seq)
        assert chunk is not None and chunk.start == covered and chunk.num_tokens <= 32 - 3
        covered += chunk.num_tokens
    assert steps == math.ceil(200 / (32 - 3))  # and the prompt used all the budget the decodes left
    h.drain()
    assert_completed(*decoders, long_seq)
    assert_engine_empty(h.sched)


def test_every_plan_respects_the_token_budget_and_the_sequence_cap() -> None:
    rng = random.Random(3)
    h = Harness(make_policy(budget=48, max_num_seqs=5), num_blocks=96)
    seqs: list[Sequence] = []
    for i in range(300):
        if i < 150 and rng.random() < 0.4:
            cls = rng.choice(["voice", "chat", "summarize"])
            seqs.append(h.add(cls, user=rng.choice("ab"), prompt_len=rng.randint(1, 120),
                              max_tokens=rng.randint(1, 20)))
        h.step()  # check_plan: budget, sequence cap, per-class caps on every plan
    h.drain()
    assert max(p.num_tokens for p in h.plans) == 48  # the limits were actually reached
    assert max(len(p.chunks) for p in h.plans) == 5
    assert_completed(*seqs)
    assert_engine_empty(h.sched)


def test_class_max_running_caps_that_class_only() -> None:
    h = Harness(make_policy(chat={"max_running": 2}, voice={"max_running": 1}))
    chats = [h.add("chat", max_tokens=6) for _ in range(5)]
    voices = [h.add("voice", max_tokens=6) for _ in range(2)]
    plan = h.step()
    assert {c.seq_id for c in plan.chunks} == {chats[0].seq_id, chats[1].seq_id, voices[0].seq_id}
    assert h.sched.classes["chat"].num_running == 2 and h.sched.num_waiting == 4
    h.drain()  # check_plan asserts the caps on every step
    assert_completed(*chats, *voices)
    assert_engine_empty(h.sched)


def test_background_min_share_keeps_a_backlogged_background_class_served() -> None:
    """Chat saturates every step (all sequence slots, more queued all the time). Without a min_share the
    background class gets nothing; with one it gets tokens in every share window, at least its share
    overall, and finishes requests: the sequence holding its share (min_share of the slots: one here)
    keeps its slot instead of being preempted by the next chat admission and recomputed forever."""

    def run(min_share: float) -> tuple[list[int], list[int], list[Sequence]]:
        policy = make_policy(budget=64, max_num_seqs=6, summarize={"min_share": min_share, "max_running": 2})
        h = Harness(policy, num_blocks=1024)
        bg = [h.add("summarize", user="indexer", prompt_len=600, max_tokens=4) for _ in range(40)]
        bg_ids = {s.seq_id for s in bg}
        bg_tokens, all_tokens = [], []
        for _ in range(600):
            while len(h.sched.classes["chat"].queue) < 4:
                h.add("chat", prompt_len=40, max_tokens=16)
            plan = h.step()
            bg_tokens.append(sum(c.num_tokens for c in plan.chunks if c.seq_id in bg_ids))
            all_tokens.append(plan.num_tokens)
        abort_all(h.sched)
        assert_engine_empty(h.sched)
        return bg_tokens, all_tokens, bg

    bg_tokens, _, bg = run(0.0)
    assert sum(bg_tokens) == 0  # background only fills idle capacity, and there is none
    bg_tokens, all_tokens, bg = run(0.2)
    window = SHARE_WINDOW_STEPS
    assert all(sum(bg_tokens[i:i + window]) > 0 for i in range(len(bg_tokens) - window))
    assert sum(bg_tokens) >= 0.2 * sum(all_tokens)
    assert sum(s.status == SequenceStatus.FINISHED_LENGTH for s in bg) >= 6


def test_steps_are_cut_to_the_itl_target_while_interactive_work_runs_and_full_when_quiet() -> None:
    """Budget 256, a step costing 10 ms + 1 ms per token: while chat decodes (ITL 100 ms) a step takes at
    most 60 % of it (50 tokens) and background prompt chunks its min_share of that, at least 32 tokens;
    moments after chat left, the house is still active: min_share of the step's budget (TTFT-bound, so
    256: 64 tokens); a quiet house gives background the whole budget."""
    policy = make_policy(budget=256, chat={"targets": {"ttft_ms": 1000, "itl_ms": 100}},
                         summarize={"min_share": 0.25})
    h = Harness(policy, num_blocks=1024)
    h.sched.step_cost = StepCostModel(base_s=0.01, per_token_s=0.001)
    chat = h.add("chat", max_tokens=500)
    h.step()
    bg = h.add("summarize", prompt_len=2000, max_tokens=1)
    plan = h.step()
    assert tokens_of(plan, bg) == 32 and h.sched.step_token_budget() == 50
    h.sched.abort(chat.request_id)
    assert tokens_of(h.step(), bg) == 64
    h.clock.advance(INTERACTIVE_HORIZON_S)
    assert tokens_of(h.step(), bg) == 256
    h.drain()
    assert_completed(bg)
    assert_engine_empty(h.sched)


# ---- delay window ----------------------------------------------------------------------------------
def test_delay_window_lets_two_arrivals_share_one_step() -> None:
    h = Harness(make_policy(chat={"max_queue_delay_microseconds": 5000, "max_batch_size": 4}))
    a = h.add("chat")
    h.clock.advance(1000 * US)
    b = h.add("chat")
    assert h.step(dt_s=0).is_empty  # the window is still open
    assert h.sched.next_wake_s() == pytest.approx(5000 * US)  # it closes 5 ms after the oldest
    h.clock.set(4990 * US)
    assert h.step(dt_s=0).is_empty
    h.clock.set(5000 * US)
    plan = h.step(dt_s=0)
    assert {c.seq_id for c in plan.chunks} == {a.seq_id, b.seq_id}  # both in one step
    h.clock.advance(1000 * US)
    late = [h.add("chat") for _ in range(3)]
    assert {c.seq_id for c in h.step(dt_s=0).chunks} == {a.seq_id, b.seq_id}  # a new window for them
    late.append(h.add("chat"))  # max_batch_size queued: admitted at once
    plan = h.step(dt_s=0)
    assert {c.seq_id for c in plan.chunks} >= {s.seq_id for s in late}
    h.drain()
    assert_completed(a, b, *late)
    assert_engine_empty(h.sched)


# ---- VTC inside a class ----------------------------------------------------------------------------
def test_admissions_alternate_between_a_heavy_and_a_light_user_by_counter() -> None:
    h = Harness(make_policy(chat={"max_running": 1}))
    heavy = [h.add("chat", user="heavy", prompt_len=8, max_tokens=4) for _ in range(8)]
    light = [h.add("chat", user="light", prompt_len=8, max_tokens=4) for _ in range(3)]
    h.drain()
    order = sorted(heavy + light, key=h.first_step)
    assert [s.user for s in order] == ["heavy", "light"] * 3 + ["heavy"] * 5
    fairness = h.sched.class_stats()["chat"]["fairness"]
    assert fairness == {"heavy": 8 * (8 + 2 * 4), "light": 3 * (8 + 2 * 4)}  # counters are in stats
    assert_completed(*heavy, *light)
    assert_engine_empty(h.sched)


@pytest.mark.parametrize(("w_in", "w_out"), [(1.0, 2.0), (0.5, 4.0)])
def test_two_backlogged_users_stay_within_the_vtc_bound(w_in: float, w_out: float) -> None:
    """Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024), Section 4: for two clients
    f and g backlogged over [t1, t2), |W_f(t1, t2) - W_g(t1, t2)| <= 2U, W being the weighted service
    (w_in x input tokens + w_out x output tokens) and U the most one admission can add. The paper's U
    is w_in x L_input + w_out x M, M the output tokens a running batch holds; with one request running
    at a time (max_running=1) that is U = max over requests of (w_in x L_in + w_out x L_out)."""
    rng = random.Random(11)
    fairness = {"w_in": w_in, "w_out": w_out}
    h = Harness(make_policy(budget=256, chat={"max_running": 1, "fairness": fairness}), num_blocks=512)
    sizes = [(rng.randint(1, 120), rng.randint(1, 40)) for _ in range(12)]
    u_max = max(w_in * n_in + w_out * n_out for n_in, n_out in sizes)
    served = {"f": 0.0, "g": 0.0}
    diffs = []
    for _ in range(1500):
        for user in served:  # both users stay backlogged throughout
            while h.sched.classes["chat"].queue.num_queued_for(user) < 2:
                n_in, n_out = rng.choice(sizes)
                h.add("chat", user=user, prompt_len=n_in, max_tokens=n_out)
        plan = h.sched.schedule()
        check_plan(h.sched, plan)
        for c in plan.chunks:  # measured from the plans, independently of the scheduler's counters
            seq = h.sched.seqs[c.seq_id]
            prompt = max(0, min(c.start + c.num_tokens, seq.num_prompt_tokens) - c.start)
            served[seq.user] += w_in * prompt + w_out * c.sample
        h.sched.update(plan, h.runner.execute(plan, h.sched.seqs))
        diffs.append(served["f"] - served["g"])
    assert min(served.values()) > 0.4 * sum(served.values())
    assert max(diffs) - min(diffs) <= 2 * u_max  # over every interval [t1, t2) of the run
    abort_all(h.sched)
    assert_engine_empty(h.sched)


# ---- timeouts, aborts, policy swaps ----------------------------------------------------------------
def test_queue_timeout_reject_surfaces_through_drain_rejected() -> None:
    voice = {"max_running": 1, "default_queue_policy": {
        "timeout_action": "REJECT", "default_timeout_microseconds": 500_000, "allow_timeout_override": True}}
    h = Harness(make_policy(voice=voice))
    running = h.add("voice", max_tokens=100)
    h.step()
    late = h.add("voice")
    hurried = h.add("voice", timeout_us=100_000)  # may shorten its timeout
    assert h.sched.classes["voice"].queue.next_expiry_at() == pytest.approx(0.11)
    for _ in range(15):
        h.step(dt_s=0.02)
        if h.sched.rejected:
            break
    assert h.sched.drain_rejected() == [hurried] and h.sched.drain_rejected() == []
    for _ in range(25):
        h.step(dt_s=0.02)
    assert h.sched.has_work()
    assert h.sched.drain_rejected() == [late]
    for seq in (late, hurried):
        assert seq.status == SequenceStatus.FINISHED_TIMED_OUT and seq.error == "queue timeout"
        assert seq.seq_id not in h.sched.seqs and not h.ran(seq)
    h.drain()
    assert_completed(running)
    assert_engine_empty(h.sched)


def test_a_timeout_found_while_adding_is_rejected_at_once_and_only_once() -> None:
    """Adding a request applies the queue's timeouts; what expired is failed then, never left in limbo
    (neither queued nor finished) where an abort would finish it a second time."""
    voice = {"max_running": 1, "default_queue_policy": {"timeout_action": "REJECT",
                                                         "default_timeout_microseconds": 100_000}}
    h = Harness(make_policy(voice=voice))
    running = h.add("voice", max_tokens=50)
    h.step()
    expired = h.add("voice")
    h.clock.advance(0.2)
    h.add("voice", max_tokens=1)
    assert expired.status == SequenceStatus.FINISHED_TIMED_OUT and expired.seq_id not in h.sched.seqs
    assert h.sched.abort(expired.request_id) is None  # already finished: not aborted a second time
    assert h.sched.drain_rejected() == [expired]
    h.sched.abort(running.request_id)
    h.drain()
    assert not h.ran(expired)
    assert_engine_empty(h.sched)


def test_an_aborted_queued_request_never_reaches_a_plan() -> None:
    h = Harness(make_policy(max_num_seqs=1, chat={"max_queue_delay_microseconds": 50_000}))
    first, queued = h.add("chat", max_tokens=5), h.add("chat", max_tokens=5)
    h.clock.set(0.05)
    h.step()
    assert h.sched.abort(queued.request_id) is queued and h.sched.abort("nobody") is None
    assert queued.status == SequenceStatus.FINISHED_ABORTED
    in_window = h.add("chat")  # aborted while its delay window holds it
    h.sched.abort(in_window.request_id)
    bg = h.add("summarize", max_tokens=50)
    h.drain()
    assert not h.ran(queued) and not h.ran(in_window)
    assert_completed(first, bg)
    # A preempted sequence is queued again: aborting it there drops it for good.
    bg = h.add("summarize", max_tokens=50)
    h.step()
    h.add("voice")
    assert h.step().preempted == [bg.seq_id]
    h.sched.abort(bg.request_id)
    after = len(h.plans)
    h.drain()
    assert all(chunk_of(p, bg) is None for p in h.plans[after:])
    assert bg.status == SequenceStatus.FINISHED_ABORTED and len(h.sched.classes["summarize"].queue) == 0
    assert_engine_empty(h.sched)


def test_policy_swap_keeps_queued_requests_in_place_and_limits_apply_from_the_next_step() -> None:
    h = Harness(make_policy(chat={"max_running": 1}))
    seqs = [h.add("chat", max_tokens=20) for _ in range(6)]
    h.step()
    queue = h.sched.classes["chat"].queue
    assert [item.request_id for item in queue] == [s.request_id for s in seqs[1:]]
    h.sched.apply_policy(make_policy(chat={"max_running": 3, "max_batch_size": 2}))
    assert [item.request_id for item in queue] == [s.request_id for s in seqs[1:]]  # kept their place
    plan = h.step()
    assert {c.seq_id for c in plan.chunks} == {s.seq_id for s in seqs[:3]}  # the new cap, in order
    h.sched.apply_policy(make_policy(chat={"max_running": 1}))
    plan = h.step()  # a lower cap holds from the next step: the newest running go back, at the head
    assert plan.preempted == [seqs[2].seq_id, seqs[1].seq_id]
    assert [item.request_id for item in queue] == [s.request_id for s in seqs[1:]]
    h.drain()
    done_order = sorted(seqs, key=lambda s: max(i for i, p in enumerate(h.plans) if chunk_of(p, s)))
    assert done_order == seqs
    assert_completed(*seqs)
    assert_engine_empty(h.sched)


@pytest.mark.parametrize(("max_num_seqs", "share"), [(4, 0.2), (8, 0.1), (16, 0.05)])
def test_a_share_below_one_slot_still_gets_a_slot(max_num_seqs: int, share: float) -> None:
    """min_share x max_num_seqs below one rounded down to no slot: while chat kept every slot busy the
    background request never ran (the default summarize share of 0.05 with max_num_seqs 16)."""
    h = Harness(make_policy(budget=256, max_num_seqs=max_num_seqs, summarize={"min_share": share}), num_blocks=4096)
    for i in range(max_num_seqs + 2):
        h.add("chat", user=f"c{i}", max_tokens=20)
    h.step()
    background = h.add("summarize", user="bg", max_tokens=4)
    k = 0
    for _ in range(200):
        h.step()
        while len(h.sched.classes["chat"].queue) < max_num_seqs + 2:
            k += 1
            h.add("chat", user=f"c{k % 7}", max_tokens=20)
        if h.ran(background):
            return
    raise AssertionError("the background request never ran")
