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


def _two_replicas(shared: bool, sync_every: int = 5) -> dict[str, float]:
    """Two replicas (two class schedulers), one chat at a time each, alice (weight 2) and bob (weight 1)
    always with two chats queued on each; the front door syncs the counters every ``sync_every`` steps
    (about its load poll against a step's length). Returns each user's weighted service, measured from
    the plans as the front door counts it."""
    policy = parse_policy(yaml.safe_dump(DOC), source="test-policy")
    replicas = [Harness(policy, num_blocks=8192, block_size=16) for _ in range(2)]
    front = SharedCounters(policy)
    served = {"alice": 0.0, "bob": 0.0}
    for step in range(3000):
        for h in replicas:
            queue = h.sched.classes["chat"].queue
            for user in ("alice", "bob"):
                while queue.num_queued_for(user) < 2:
                    h.add("chat", user=user, prompt_len=30, max_tokens=24)
            plan = h.sched.schedule()
            for c in plan.chunks:
                seq = h.sched.seqs[c.seq_id]
                fresh = max(0, min(c.start + c.num_tokens, seq.num_prompt_tokens) - c.start)
                front.charge("chat", seq.user, fresh, int(c.sample))
                served[seq.user] += (fresh + 2 * c.sample) / (2.0 if seq.user == "alice" else 1.0)
            h.sched.update(plan, h.runner.execute(plan, h.sched.seqs))
        if shared and step % sync_every == 0:
            for h in replicas:
                h.sched.share_counters(front.snapshot())
    for h in replicas:
        abort_all(h.sched)
    return served


def test_weights_hold_across_two_replicas_with_the_shared_counter() -> None:
    """Weighted service (tokens over weight) comes out even: alice gets twice bob's tokens, on two replicas
    as on one, with the counters synced as the front door syncs them."""
    served = _two_replicas(shared=True)
    assert 0.9 <= served["alice"] / served["bob"] <= 1.1
