"""VTC: charging, the lift, picking, and the paper's bound on service difference."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_helpers import admit
from hypothesis import given, settings
from hypothesis import strategies as st

from homeai.policy.loader import load_policy
from homeai.policy.schema import ClassPolicy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem
from homeai.scheduling.fairness import VirtualTokenCounter

DEFAULT = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def test_charge_weights_tokens_and_divides_by_the_user_weight() -> None:
    vtc = VirtualTokenCounter(w_in=1.0, w_out=2.0, weights={"alice": 2.0})
    assert vtc.charge("bob", input_tokens=10, output_tokens=5) == 20.0
    assert vtc.charge("alice", input_tokens=10, output_tokens=5) == 10.0
    assert vtc.snapshot() == {"bob": 20.0, "alice": 10.0}


def test_a_user_becoming_backlogged_is_lifted_to_the_backlogged_minimum() -> None:
    vtc = VirtualTokenCounter()
    vtc.charge("a", 100)
    vtc.charge("b", 10)
    assert vtc.on_backlogged("c", ["a", "b", "c"]) == 10.0  # max(0, min(100, 10))
    vtc.charge("d", 50)
    assert vtc.on_backlogged("d", ["a", "b"]) == 50.0  # never lowered
    # Nobody else backlogged: lifted to the counter of the last user that left the backlog.
    vtc.on_drained("a")
    assert vtc.on_backlogged("e", []) == 100.0


def test_pick_takes_the_lowest_counter_and_breaks_ties_by_the_given_order() -> None:
    vtc = VirtualTokenCounter()
    vtc.charge("a", 5)
    vtc.charge("b", 5)
    vtc.charge("c", 9)
    assert vtc.pick(["b", "a", "c"]) == "b" and vtc.pick(["a", "b", "c"]) == "a"
    assert vtc.pick(["c", "new"]) == "c" and vtc.counter("new") == 9.0  # unknown: lifted to the min
    with pytest.raises(ValueError):
        vtc.pick([])


def test_weights_and_cost_weights_come_from_the_policy() -> None:
    policy = load_policy(DEFAULT)
    vtc = VirtualTokenCounter.from_policy(policy, "chat")
    assert (vtc.w_in, vtc.w_out) == (1.0, 2.0)
    assert vtc.weight("alice") == 2.0 and vtc.weight("kids") == 0.5 and vtc.weight("stranger") == 1.0


def simulate(weights: dict[str, float], sizes: list[tuple[int, int]], w_in: float, w_out: float,
             n_requests: int) -> tuple[VirtualTokenCounter, list[float], dict[str, int]]:
    """Two always-backlogged users in one ClassQueue, served one request at a time: the prompt is
    charged at admission, then each output token as it is decoded. Returns the counter difference
    after every charge and the raw tokens served per user."""
    vtc = VirtualTokenCounter(w_in, w_out, weights)
    q = ClassQueue("chat", ClassPolicy(kind="llm", model="m"))
    rng = random.Random(0)
    served = dict.fromkeys(weights, 0)
    n = 0

    def refill() -> None:
        nonlocal n
        for user in weights:
            while q.num_queued_for(user) < 2:
                was_idle = q.num_queued_for(user) == 0
                n_in, n_out = sizes[rng.randrange(len(sizes))]
                q.push(QueuedItem(f"r{n}", user, cost=n_in, payload=n_out), 0.0)
                n += 1
                if was_idle:
                    vtc.on_backlogged(user, q.users_queued())

    a, b = weights
    diffs = [0.0]
    refill()
    for _ in range(n_requests):
        item = admit(q, 0.0, vtc.pick)
        assert item is not None
        refill()  # both users stay backlogged throughout
        vtc.charge(item.user, input_tokens=item.cost)
        served[item.user] += item.cost
        diffs.append(vtc.counter(a) - vtc.counter(b))
        for _ in range(item.payload):
            vtc.charge(item.user, output_tokens=1)
            served[item.user] += 1
            diffs.append(vtc.counter(a) - vtc.counter(b))
    return vtc, diffs, served


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 200)), min_size=1, max_size=8),
    w_in=st.sampled_from([0.5, 1.0, 2.0]),
    w_out=st.sampled_from([1.0, 2.0, 4.0]),
)
def test_backlogged_users_service_difference_is_within_twice_the_largest_request_cost(
    sizes: list[tuple[int, int]], w_in: float, w_out: float
) -> None:
    """Sheng et al. (OSDI 2024), Theorem: for two clients f, g backlogged over [t1, t2),
    |W_f(t1, t2) - W_g(t1, t2)| <= 2U, where W is the weighted service (w_in * input tokens +
    w_out * output tokens) and U = max over requests of (w_in * L_in + w_out * L_out)."""
    u_max = max(w_in * n_in + w_out * n_out for n_in, n_out in sizes)
    _, diffs, _ = simulate({"f": 1.0, "g": 1.0}, sizes, w_in, w_out, n_requests=40)
    # W_f(t1,t2) - W_g(t1,t2) = d(t2) - d(t1) with d the counter difference (both start at 0).
    assert max(diffs) - min(diffs) <= 2 * u_max + 1e-9
    assert max(abs(d) for d in diffs) <= u_max + 1e-9  # one request at a time: within U at all times


def test_weights_scale_the_shares() -> None:
    sizes = [(50, 20), (200, 100), (10, 64)]
    vtc, diffs, served = simulate({"alice": 2.0, "bob": 1.0}, sizes, 1.0, 2.0, n_requests=400)
    ratio = served["alice"] / served["bob"]
    assert 1.85 < ratio < 2.15
    u_max = max(n_in + 2 * n_out for n_in, n_out in sizes)
    assert max(abs(d) for d in diffs) <= u_max / 1.0 + 1e-9  # counters are already weight-normalized
