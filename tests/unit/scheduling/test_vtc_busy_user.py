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


def test_idle_users_at_the_floor_are_forgotten_and_come_back_where_they_would_have() -> None:
    """Found by a review: counters were never dropped, so every user name ever seen (a keyless client's
    per-conversation ``user``) stayed in the map, copied for the stats every 50 ms."""
    vtc = VirtualTokenCounter()
    vtc.charge("alice", 100)
    vtc.charge("bob", 300)
    for i in range(10):
        vtc.charge(f"once-{i}", 50)
    assert vtc.forget_idle(["alice"]) == 10  # at or below the floor (alice's 100): they would be lifted to it
    assert set(vtc.snapshot()) == {"alice", "bob"}  # bob got more than the floor: his counter stays
    assert vtc.on_backlogged("once-3", ["alice"]) == 100.0  # back at the floor, as if it had been kept


def test_a_class_keeps_a_bounded_number_of_idle_users_counters() -> None:
    from homeai.scheduling.fairness import IDLE_COUNTERS_KEPT

    doc = {"classes": {"chat": {"kind": "llm", "model": "m", "priority": 1}},
           "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 8}}
    h = Harness(parse_policy(yaml.safe_dump(doc), source="test-policy"), num_blocks=8192, block_size=16)
    vtc = h.sched.classes["chat"].vtc
    for i in range(2000):  # one request each from 2,000 user names, served to the end
        h.add("chat", user=f"conversation-{i}", prompt_len=8, max_tokens=2)
        if i % 8 == 7:
            h.drain()
    h.drain()
    h.sched.schedule()
    assert len(vtc) <= IDLE_COUNTERS_KEPT + 1, len(vtc)
    assert_engine_empty(h.sched)
