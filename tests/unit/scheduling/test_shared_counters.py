"""One VTC counter per user across a cluster's replicas: a replica raises its counters to the front
door's (the service each user got on every replica), so a user served elsewhere waits here."""

from __future__ import annotations

import yaml
from engine_helpers import assert_engine_empty
from test_class_scheduler import Harness, abort_all

from homeai.cluster.shared_fairness import SharedCounters
from homeai.policy.loader import parse_policy
from homeai.scheduling.fairness import VirtualTokenCounter

DOC = {"classes": {"chat": {"kind": "llm", "model": "m", "priority": 1, "max_running": 1},
                   "embedding": {"kind": "embedding", "model": "e", "priority": 2}},
       "users": {"alice": {"weight": 2.0}, "bob": {"weight": 1.0}},
       "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 8}}


def test_raise_to_only_raises() -> None:
    vtc = VirtualTokenCounter()
    vtc.charge("alice", 100)
    vtc.raise_to("alice", 50)
    vtc.raise_to("bob", 30)
    assert vtc.snapshot() == {"alice": 100.0, "bob": 30.0}


def test_the_front_door_counts_service_as_a_replica_does() -> None:
    policy = parse_policy(yaml.safe_dump(DOC), source="test-policy")
    shared, local = SharedCounters(policy), VirtualTokenCounter.from_policy(policy, "chat")
    for user, prompt, out in (("alice", 300, 20), ("bob", 40, 100), ("alice", 10, 5)):
        shared.charge("chat", user, prompt, 0)
        shared.charge("chat", user, 0, out)
        local.charge(user, prompt, out)
    assert shared.snapshot() == {"chat": local.snapshot()}  # LLM classes only, same weighted tokens


def _admission_order(share: dict[str, dict[str, float]] | None) -> list[str]:
    """alice and bob queue two chats each on an idle replica that runs one at a time; ``share``: what the
    front door says they received elsewhere."""
    h = Harness(parse_policy(yaml.safe_dump(DOC), source="test-policy"), num_blocks=4096, block_size=16)
    for _ in range(2):
        h.add("chat", user="alice", prompt_len=20, max_tokens=4)
        h.add("chat", user="bob", prompt_len=20, max_tokens=4)
    if share is not None:
        h.sched.share_counters(share)
    order: list[str] = []
    for _ in range(200):  # four 4-token chats, one at a time: a few dozen steps
        plan = h.sched.schedule()
        order += [h.sched.seqs[c.seq_id].user for c in plan.chunks if c.start == 0]
        h.sched.update(plan, h.runner.execute(plan, h.sched.seqs))
    assert len(order) == 4
    abort_all(h.sched)
    assert_engine_empty(h.sched)
    return order


def test_a_user_served_on_another_replica_waits_here() -> None:
    assert _admission_order(None)[:2] == ["alice", "bob"]  # both fresh here: arrival order
    # alice already received 10,000 weighted tokens on the other replica: bob's requests go first
    assert _admission_order({"chat": {"alice": 10_000.0}})[:2] == ["bob", "bob"]
