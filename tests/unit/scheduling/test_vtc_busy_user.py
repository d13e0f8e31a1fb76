"""VTC inside a class: a user whose requests still run is busy, not back from idle, so a request it
queues meanwhile does not lift its counter to the others' (only a user with nothing queued and nothing
running is lifted)."""

from __future__ import annotations

import yaml
from engine_helpers import assert_engine_empty
from test_class_scheduler import Harness, abort_all, check_plan

from homeai.policy.loader import parse_policy
from homeai.scheduling.fairness import VirtualTokenCounter


def test_a_busy_user_is_not_lifted_but_an_idle_one_is() -> None:
    vtc = VirtualTokenCounter()
    vtc.charge("alice", 10)
    vtc.charge("bob", 1000)
    assert vtc.on_backlogged("alice", ["bob"], num_running=3) == 10.0  # busy: keeps its counter
    assert vtc.on_backlogged("alice", ["bob"], num_running=0) == 1000.0  # back from idle: lifted


def test_weights_hold_for_a_user_who_queues_while_its_requests_decode() -> None:
    """alice (weight 2: 10 in / 500 out, one more queued each time one of hers is admitted) against bob
    (weight 1: 1,000 in / 10 out, always 4 queued), two chats running at a time: alice's weighted
    service is twice bob's (before: 1.06, as every request she queued while hers decoded lifted her
    counter to bob's)."""
    doc = {"classes": {"chat": {"kind": "llm", "model": "m", "priority": 1, "max_running": 2}},
           "users": {"alice": {"weight": 2.0}, "bob": {"weight": 1.0}},
           "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 8}}
    h = Harness(parse_policy(yaml.safe_dump(doc), source="test-policy"), num_blocks=8192, block_size=16)
    queue = h.sched.classes["chat"].queue
    served = {"alice": 0.0, "bob": 0.0}
    for _ in range(3000):
        if queue.num_queued_for("alice") == 0:
            h.add("chat", user="alice", prompt_len=10, max_tokens=500)
        while queue.num_queued_for("bob") < 4:
            h.add("chat", user="bob", prompt_len=1000, max_tokens=10)
        plan = h.sched.schedule()
        check_plan(h.sched, plan)
        for c in plan.chunks:  # measured from the plans: w_in x prompt tokens + w_out x sampled tokens
            seq = h.sched.seqs[c.seq_id]
            served[seq.user] += max(0, min(c.start + c.num_tokens, seq.num_prompt_tokens) - c.start) + 2 * c.sample
        h.sched.update(plan, h.runner.execute(plan, h.sched.seqs))
    assert 1.8 <= served["alice"] / served["bob"] <= 2.2
    abort_all(h.sched)
    assert_engine_empty(h.sched)
