"""The planner's targets on virtual time: min_share is a rate that never locks voice out, steps are
sized by the latency targets and a waiting voice request goes before a chat prompt's next chunk, and
VTC charges a prompt at admission. Each test failed on the planner before the fix."""

from __future__ import annotations

from engine_helpers import assert_engine_empty
from hypothesis import given, settings
from hypothesis import strategies as st
from test_class_scheduler import Harness, abort_all, assert_completed, make_policy, tokens_of

from homeai.core.sequence import SequenceStatus
from homeai.scheduling.class_scheduler import INTERACTIVE_HORIZON_S
from homeai.scheduling.min_share import SHARE_BURST_STEPS
from homeai.scheduling.step_budget import (
    ITL_STEP_FRACTION,
    MIN_STEP_TOKENS,
    QUIET_TTFT_STEP_FRACTION,
    ClassTargets,
    StepCostModel,
    step_token_budget,
)


# ---- a cold start is not starvation; a share never locks voice out ----------------------------------
def test_background_admitted_at_a_cold_start_gives_its_slot_to_voice_at_once() -> None:
    """Four summaries fill every slot of an idle server; a voice request then runs in the very next
    step (it waited for the whole background output before: they were all 'admitted for min_share')."""
    h = Harness(make_policy(budget=256, max_num_seqs=4, summarize={"min_share": 0.05, "max_running": 4}))
    bg = [h.add("summarize", user="indexer", prompt_len=32, max_tokens=200) for _ in range(4)]
    for _ in range(3):
        h.step()
    assert h.sched.num_running == 4
    voice = h.add("voice", prompt_len=8, max_tokens=4)
    assert tokens_of(h.step(), voice) == 8
    h.drain()
    assert_completed(voice, *bg)
    assert_engine_empty(h.sched)


def test_voice_takes_kv_blocks_from_background_admitted_at_a_cold_start() -> None:
    """The same with a full KV pool instead of full slots: voice's prompt runs in the next step."""
    h = Harness(make_policy(budget=256, max_num_seqs=8, summarize={"min_share": 0.05, "max_running": 4}),
                num_blocks=64, block_size=4)
    bg = [h.add("summarize", user="indexer", prompt_len=60, max_tokens=120) for _ in range(4)]
    for _ in range(3):
        h.step()
    assert h.bm.num_free_blocks < 4
    voice = h.add("voice", prompt_len=16, max_tokens=4)
    assert tokens_of(h.step(), voice) == 16
    h.drain()
    assert_completed(voice, *bg)
    assert_engine_empty(h.sched)


# ---- the share refills as a rate; a late start repays no debt in a burst ----------------------------
def test_a_background_class_that_starts_late_gets_its_share_per_step_not_a_burst() -> None:
    """Chat fills every step for 200 steps; then summaries arrive. The background class gets about its
    share of each step from then on: never more than a couple of steps' share in one step while chat
    still wants the budget, and at least its share over any 20 steps."""
    share, budget = 0.2, 64
    h = Harness(make_policy(budget=budget, max_num_seqs=8, summarize={"min_share": share, "max_running": 2}),
                num_blocks=2048)

    def chat_load() -> None:
        while len(h.sched.classes["chat"].queue) < 4:
            h.add("chat", prompt_len=200, max_tokens=2)

    for _ in range(200):
        chat_load()
        h.step()
    bg = [h.add("summarize", user="indexer", prompt_len=2000, max_tokens=2) for _ in range(4)]
    bg_ids = {s.seq_id for s in bg}
    per_step = []
    for _ in range(100):
        chat_load()
        plan = h.step()
        per_step.append(sum(c.num_tokens for c in plan.chunks if c.seq_id in bg_ids))
    assert max(per_step) <= SHARE_BURST_STEPS * share * budget + 1
    assert all(sum(per_step[i:i + 20]) >= 0.9 * share * budget * 20 for i in range(0, 80))
    abort_all(h.sched)
    assert_engine_empty(h.sched)


# ---- steps sized by the targets; voice before a chat prompt's next chunk ----------------------------
def test_voice_arriving_during_a_long_chat_prefill_runs_in_the_next_step() -> None:
    """Budget 512, an 8000-token chat prompt prefilling: a voice request gets its prompt (and so its
    first token) in the next step; chat's chunk shrinks to what is left (before: after 14 steps)."""
    h = Harness(make_policy(budget=512, max_num_seqs=8), num_blocks=4096, block_size=4)
    chat = h.add("chat", prompt_len=8000, max_tokens=2)
    h.step()
    h.step()
    voice = h.add("voice", prompt_len=40, max_tokens=3)
    plan = h.step()
    assert tokens_of(plan, voice) == 40 and tokens_of(plan, chat) == 512 - 40
    assert voice.num_output_tokens == 1
    h.drain()
    assert_completed(chat, voice)
    assert_engine_empty(h.sched)


def test_a_step_lasts_no_longer_than_the_tightest_itl_share_while_voice_decodes() -> None:
    """Voice (ITL 100 ms) decodes while a 6000-token chat prompt and background summaries wait: on a
    device costing 16 ms + 0.1 ms per token, every step's cost stays within ITL_STEP_FRACTION of the
    target, chat's prompt chunks included (before: full 2048-token steps, 221 ms)."""
    policy = make_policy(budget=2048, max_num_seqs=16,
                         voice={"targets": {"ttft_ms": 300, "itl_ms": 100}},
                         chat={"targets": {"ttft_ms": 1000, "itl_ms": 150}},
                         summarize={"min_share": 0.05})
    h = Harness(policy, num_blocks=8192, block_size=16)
    cost = StepCostModel(base_s=0.016, per_token_s=0.0001)
    h.sched.step_cost = cost
    voice = h.add("voice", prompt_len=40, max_tokens=60)
    h.step()
    chat = h.add("chat", prompt_len=6000, max_tokens=2)
    bg = h.add("summarize", user="indexer", prompt_len=1500, max_tokens=2)
    while voice.status == SequenceStatus.RUNNING:
        plan = h.step()
        assert cost.step_s(plan.num_tokens) <= ITL_STEP_FRACTION * 0.1 + 1e-9
    assert tokens_of(h.plans[2], chat) > 0  # chat still makes progress beside voice
    h.drain()
    assert_completed(voice, chat, bg)
    assert_engine_empty(h.sched)


def test_on_a_device_slower_than_the_targets_decodes_leave_room_for_a_voice_prompt() -> None:
    """A busy 2-core CPU (100 ms + 10 ms per token): no step meets voice's targets, so the budget is
    MIN_STEP_TOKENS. Twenty chat decodes are due; a voice request's prompt still runs in the next step
    beside all of them (before: the decodes took the whole budget and voice waited for chats to end)."""
    policy = make_policy(budget=2048, max_num_seqs=32, voice={"targets": {"ttft_ms": 300, "itl_ms": 100}},
                         chat={"targets": {"ttft_ms": 1000, "itl_ms": 150}})
    h = Harness(policy, num_blocks=1024, block_size=4)
    chats = [h.add("chat", user=f"u{i % 2}", prompt_len=8, max_tokens=40) for i in range(20)]
    while any(c.num_output_tokens == 0 for c in chats):
        h.step()
    h.sched.step_cost = StepCostModel(base_s=0.1, per_token_s=0.01)
    assert h.sched.step_token_budget() == MIN_STEP_TOKENS
    voice = h.add("voice", prompt_len=12, max_tokens=3)
    plan = h.step()
    assert tokens_of(plan, voice) == 12 and all(tokens_of(plan, c) == 1 for c in chats)
    assert plan.num_tokens <= len(chats) + MIN_STEP_TOKENS
    h.drain()
    assert_completed(voice, *chats)
    assert_engine_empty(h.sched)


def test_a_step_never_has_less_token_work_than_its_fixed_cost() -> None:
    """Where the targets would cut a step below its fixed cost's worth of tokens (190 ms + 4 ms per token,
    voice ITL 100 ms), the step takes that much (47 tokens): 16-token steps met no target either and spent
    most of the device on fixed costs. A fast device's budget is still the target's."""
    voice = ClassTargets(ttft_s=0.3, itl_s=0.1, running=True, active=True)
    slow = StepCostModel(base_s=0.19, per_token_s=0.004)
    assert step_token_budget(slow, 2048, [voice]) == slow.tokens_within(2 * slow.base_s) == 47
    fast = StepCostModel(base_s=0.016, per_token_s=0.0001)
    assert step_token_budget(fast, 2048, [voice]) == fast.tokens_within(ITL_STEP_FRACTION * 0.1) == 440


def test_the_step_cost_model_fits_measured_steps() -> None:
    """Fitted online from (tokens, seconds): the seed is outweighed by a few dozen real steps."""
    cost = StepCostModel(base_s=0.1, per_token_s=0.01)
    for n in [1, 64, 512, 8, 2048, 100] * 10:
        cost.observe(n, 0.016 + 0.0001 * n)
    assert abs(cost.base_s - 0.016) < 0.004 and abs(cost.per_token_s - 0.0001) < 0.00002


# ---- VTC charges the prompt at admission (else one user's counter stands still for a whole step) ---
def test_one_admission_loop_alternates_users_because_the_prompt_is_charged_at_admission() -> None:
    """Two users with ten 8-token requests each and room for all in one step: admissions alternate
    (before, the first user's counter stood still until update() and it got 11 of the first step)."""
    h = Harness(make_policy(budget=512, max_num_seqs=64), num_blocks=1024)
    for _ in range(10):
        h.add("chat", user="a", prompt_len=8, max_tokens=2)
    for _ in range(10):
        h.add("chat", user="b", prompt_len=8, max_tokens=2)
    plan = h.step()
    users = [h.sched.seqs[c.seq_id].user for c in plan.chunks]
    assert users == ["a", "b"] * 10
    h.drain()
    assert_engine_empty(h.sched)


def test_a_quiet_house_step_still_leaves_a_voice_arrival_within_its_ttft_target() -> None:
    """Only background runs, on a slow device (22 ms + 0.8 ms per token): a full 2048-token step would
    last 1.66 s, so the first voice request after a quiet period waited 1.3 s. The quiet budget keeps a
    step within QUIET_TTFT_STEP_FRACTION of voice's TTFT target; on a fast device it is the full budget."""
    policy = make_policy(budget=2048, max_num_seqs=8, voice={"targets": {"ttft_ms": 300, "itl_ms": 100}},
                         summarize={"min_share": 0.05})
    h = Harness(policy, num_blocks=4096, block_size=16)
    h.sched.step_cost = StepCostModel(base_s=0.022, per_token_s=0.0008)
    h.add("summarize", user="indexer", prompt_len=6000, max_tokens=2)
    h.clock.advance(INTERACTIVE_HORIZON_S + 1)
    plan = h.step()
    assert h.sched.step_cost.step_s(plan.num_tokens) <= QUIET_TTFT_STEP_FRACTION * 0.300 + 1e-9
    assert plan.num_tokens == h.sched.step_cost.tokens_within(QUIET_TTFT_STEP_FRACTION * 0.300)
    h.sched.step_cost = StepCostModel(base_s=0.016, per_token_s=0.0001)
    assert h.step().num_tokens == 2048
    abort_all(h.sched)
    assert_engine_empty(h.sched)


# ---- random workloads through the target-sized planner ---------------------------------------------
@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["voice", "chat", "summarize", "step"]),
                              st.integers(1, 300), st.integers(1, 12)), min_size=1, max_size=60),
       budget=st.sampled_from([32, 128, 512]), max_seqs=st.integers(2, 8), blocks=st.sampled_from([48, 256]),
       share=st.sampled_from([0.0, 0.1, 0.3]))
def test_random_workloads_keep_the_limits_the_share_guard_and_finish(
        ops: list[tuple[str, int, int]], budget: int, max_seqs: int, blocks: int, share: float) -> None:
    """Whatever arrives, with latency targets and a min_share: every plan keeps the limits (checked by
    the harness), the share holds at most min_share of the slots, and everything finishes."""
    policy = make_policy(budget=budget, max_num_seqs=max_seqs,
                         voice={"targets": {"ttft_ms": 300, "itl_ms": 100}, "max_running": 4},
                         chat={"targets": {"ttft_ms": 1000, "itl_ms": 150}},
                         summarize={"min_share": share, "max_running": 3})
    h = Harness(policy, num_blocks=blocks, block_size=4)
    h.sched.step_cost = StepCostModel(base_s=0.016, per_token_s=0.0005)
    seqs = []
    for kind, prompt, out in ops:
        if kind == "step":
            h.step(dt_s=0.0)
            h.sched.drain_rejected()
        else:
            prompt = min(prompt, blocks * 4 - out - 4)  # it must fit the pool on its own
            seqs.append(h.add(kind, user=f"u{prompt % 2}", prompt_len=prompt, max_tokens=out))
        slots = max(1, int(share * max_seqs)) if share > 0 else 0  # min_share keeps at least one slot
        assert len(h.sched.shares.protected) <= slots * 1  # only one background class here
    h.drain()
    assert_completed(*seqs)
    assert_engine_empty(h.sched)
