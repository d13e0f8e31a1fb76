"""A step with work ready is never empty, whatever the fitted cost model says.

Found through the real server (tests/integration/test_long_prompts.py beside another CPU-heavy process):
steps slowed by the other process fitted a cost model whose context term made even one token of a long
prompt's next chunk outlast the step's bound (a running class's next token due by its ITL target, floored
at a step of MIN_STEP_TOKENS rows, which counts no context). Every running sequence was a mid-prompt chunk,
so every plan came out empty; an empty plan runs no step, the cost model never saw a new one, and seven
requests waited until the test's timeout (the device loop planned an empty step every 0.5 s for 9 minutes).
"""

from __future__ import annotations

from test_latency_margin import CHAT, VOICE, harness

from homeai.core.sequence import SequenceStatus
from homeai.scheduling.step_budget import StepCostModel

# The server's fit after slowed steps (step trace: an empty step predicted at 0.29 s); attention over a
# long prompt's context dominates a chunk's first token.
SLOWED = {"base_s": 0.29, "per_token_s": 0.01, "prompt_token_s": 0.005, "per_ctx_s": 2e-4}


def test_long_prompts_progress_when_the_fitted_cost_outlasts_every_bound() -> None:
    h = harness(SLOWED, voice=VOICE, chat=CHAT)
    prompts = [h.add("chat", prompt_len=1819, max_tokens=8) for _ in range(4)]
    short = h.add("chat", prompt_len=33, max_tokens=1)
    for _ in range(3000):
        if not h.sched.has_work():
            break
        plan = h.step(dt_s=0.3)
        assert not plan.is_empty, "a plan came out empty while sequences had work"
        h.sched.drain_rejected()
        h.sched.step_cost = StepCostModel(**SLOWED)  # the fit stays where the slowed steps left it
    for seq in [*prompts, short]:
        assert seq.status == SequenceStatus.FINISHED_LENGTH, (seq.request_id, seq.status)
