"""Hot swaps leave no stale class state: a class the new policy no longer serves on this model (removed,
or moved to another model) is refused new requests, stops sizing steps with its targets, rejects what
it had queued that never ran (with the reason) and finishes what already ran, then goes; a class that
stays takes its new limits."""

from __future__ import annotations

import pytest
from engine_helpers import assert_engine_empty
from test_class_scheduler import Harness, assert_completed, make_policy, tokens_of

from homeai.core.sequence import SequenceStatus
from homeai.scheduling.class_scheduler import ClassScheduler, UnknownClassError
from homeai.scheduling.step_budget import StepCostModel

VOICE_TARGETS = {"targets": {"ttft_ms": 300, "itl_ms": 100}}


def test_a_removed_class_stops_sizing_steps_and_is_refused() -> None:
    """voice (TTFT 300 ms) is removed while chat (no targets) prefills a long prompt alone: its steps
    take the full 2,048 tokens (before: 1,040, sized by the removed voice's target), and a voice request
    that reaches the scheduler after the swap is refused with the reason."""
    h = Harness(make_policy(budget=2048, voice=VOICE_TARGETS), num_blocks=4096, block_size=16)
    h.sched.step_cost = StepCostModel(base_s=0.016, per_token_s=0.0001)
    chat = h.add("chat", prompt_len=12000, max_tokens=2)
    assert h.step().num_tokens == h.sched.step_cost.tokens_within(0.4 * 0.3) == 1040
    without_voice = make_policy(budget=2048)
    h.sched.apply_policy(without_voice.model_copy(
        update={"classes": {k: v for k, v in without_voice.classes.items() if k != "voice"}}))
    assert tokens_of(h.step(), chat) == 2048
    assert "voice" not in h.sched.classes
    with pytest.raises(UnknownClassError, match="'voice'"):
        h.add("voice")
    h.drain()
    assert_completed(chat)
    assert_engine_empty(h.sched)


def test_a_removed_class_rejects_what_never_ran_and_finishes_what_runs() -> None:
    """At the swap one voice request runs and two wait: the two are rejected at once with the reason,
    the running one streams to its end; then the class is gone."""
    h = Harness(make_policy(voice={"max_running": 1}))
    running = h.add("voice", max_tokens=20)
    h.step()
    waiting = [h.add("voice", max_tokens=3) for _ in range(2)]
    policy = make_policy()
    h.sched.apply_policy(policy.model_copy(update={"classes": {k: v for k, v in policy.classes.items()
                                                               if k != "voice"}}))
    rejected = h.sched.drain_rejected()
    assert rejected == waiting
    for seq in rejected:
        assert seq.status == SequenceStatus.FINISHED_ABORTED
        assert seq.error == "class 'voice' was removed by a policy change"
        assert seq.seq_id not in h.sched.seqs
    assert "voice" in h.sched.classes  # until its running request ends
    h.drain()
    assert_completed(running)
    assert "voice" not in h.sched.classes and not any(h.ran(s) for s in waiting)
    assert_engine_empty(h.sched)


def test_a_class_moved_to_another_model_takes_its_new_limits_while_it_drains_here() -> None:
    """chat moves to another model with max_running 1 while six chats run on this one: from the next step
    one runs, the others resume one at a time (before: all six kept running on the old limits, and new
    chat requests were still queued here)."""
    h = Harness(make_policy(max_num_seqs=8))
    h.sched = ClassScheduler(h.bm, make_policy(max_num_seqs=8), h.clock, model="m")
    chats = [h.add("chat", max_tokens=12) for _ in range(6)]
    h.step()
    assert h.sched.classes["chat"].num_running == 6
    moved = make_policy(max_num_seqs=8, chat={"model": "other", "max_running": 1})
    h.sched.apply_policy(moved)
    with pytest.raises(UnknownClassError, match="now runs on model 'other'"):
        h.add("chat")
    assert h.sched.drain_rejected() == []  # all six had run: none is rejected
    plan = h.step()
    assert len(plan.preempted) == 5 and h.sched.classes["chat"].num_running == 1
    h.drain()  # check_plan holds max_running 1 on every step
    assert_completed(*chats)
    assert "chat" not in h.sched.classes
    assert_engine_empty(h.sched)
