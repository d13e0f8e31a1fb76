"""min_share never makes voice miss its first token: interactive work is planned before the share passes,
which take the budget only after it (the share still a rate: what a class could not take refills its
credit), and a policy's background shares leave interactive work at least half of every step."""

from __future__ import annotations

from engine_helpers import assert_engine_empty
from test_class_scheduler import Harness, abort_all, make_policy, tokens_of

from homeai.core.sequence import SequenceStatus
from homeai.scheduling.min_share import SHARE_BURST_STEPS
from homeai.scheduling.step_budget import StepCostModel


def test_a_voice_prompt_goes_before_a_background_class_spending_its_banked_credit() -> None:
    """A summary decodes alone (max_running 1) while others wait: its class banks SHARE_BURST_STEPS
    steps' worth of credit (2,048 tokens at min_share 0.5). When it finishes, the next summary is
    admitted on that credit in the same step a voice request arrives: voice's 40-token prompt runs in
    that step (before: the share pass went first and took the whole 1,040-token step)."""
    policy = make_policy(budget=2048, max_num_seqs=8, voice={"targets": {"ttft_ms": 300, "itl_ms": 100}},
                         summarize={"min_share": 0.5, "max_running": 1})
    h = Harness(policy, num_blocks=4096, block_size=16)
    h.sched.step_cost = StepCostModel(base_s=0.016, per_token_s=0.0001)
    first = h.add("summarize", user="indexer", prompt_len=16, max_tokens=20)
    waiting = [h.add("summarize", user="indexer", prompt_len=4000, max_tokens=2) for _ in range(2)]
    while first.status == SequenceStatus.RUNNING or first.status == SequenceStatus.WAITING:
        h.step()
    credit = h.sched.shares.ledger.credit("summarize")
    assert credit >= SHARE_BURST_STEPS * 0.5 * 2048 - 1  # its last decode was charged
    voice = h.add("voice", prompt_len=40, max_tokens=4)
    plan = h.step()
    assert tokens_of(plan, voice) == 40 and voice.num_output_tokens == 1
    assert tokens_of(plan, waiting[0]) > 0  # the share is still served in that step, after voice
    abort_all(h.sched)
    assert_engine_empty(h.sched)


def test_background_shares_keep_their_rate_when_interactive_work_goes_first() -> None:
    """Chat keeps every step full; summaries (min_share 0.25) still get their share of the budget over
    every 20 steps, and voice requests arriving meanwhile get their whole prompt in their first step."""
    policy = make_policy(budget=128, max_num_seqs=8, summarize={"min_share": 0.25, "max_running": 2})
    h = Harness(policy, num_blocks=4096)
    bg = [h.add("summarize", user="indexer", prompt_len=3000, max_tokens=2) for _ in range(4)]
    bg_ids = {s.seq_id for s in bg}
    per_step, voices = [], []
    for i in range(200):
        while len(h.sched.classes["chat"].queue) < 4:
            h.add("chat", prompt_len=200, max_tokens=2)
        if i % 10 == 5:
            voices.append(h.add("voice", prompt_len=24, max_tokens=2))
        plan = h.step()
        per_step.append(sum(c.num_tokens for c in plan.chunks if c.seq_id in bg_ids))
        if voices and voices[-1].num_output_tokens == 0:
            raise AssertionError(f"step {i}: voice waited")
    assert all(sum(per_step[i:i + 20]) >= 0.9 * 0.25 * 128 * 20 for i in range(0, 180))
    abort_all(h.sched)
    assert_engine_empty(h.sched)
