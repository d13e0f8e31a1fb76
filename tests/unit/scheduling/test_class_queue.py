"""Triton's dynamic-batcher and queue-policy semantics, one test per case, on virtual time."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import admit

from homeai.policy.schema import ClassPolicy
from homeai.scheduling.class_queue import ClassQueue, QueuedItem, QueueFullError, effective_timeout_us
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.fairness import VirtualTokenCounter

US = 1e-6
SECOND = 1_000_000  # in microseconds


def make_queue(kind: str = "embedding", **fields: Any) -> ClassQueue:
    return ClassQueue("c", ClassPolicy.model_validate({"kind": kind, "model": "m", **fields}))


def push(q: ClassQueue, clock: VirtualClock, rid: str, user: str = "u", **kw: Any) -> QueuedItem:
    item = QueuedItem(rid, user, **kw)
    q.push(item, clock.now())
    return item


def ids(items: list[QueuedItem] | None) -> list[str]:
    assert items is not None
    return [i.request_id for i in items]


def test_largest_preferred_size_goes_at_once() -> None:
    clock, q = VirtualClock(), make_queue(max_batch_size=16, preferred_batch_size=[4, 8],
                                          max_queue_delay_microseconds=1_000_000)
    for i in range(11):
        push(q, clock, f"r{i}")
    assert ids(q.form_batch(clock.now())) == [f"r{i}" for i in range(8)]  # 11 queued: 8 goes at once
    assert q.form_batch(clock.now()) is None  # 3 left: less than any preferred size, wait
    push(q, clock, "r11")
    assert ids(q.form_batch(clock.now())) == ["r8", "r9", "r10", "r11"]  # a preferred size: at once


def test_max_batch_size_goes_at_once_without_preferred_sizes() -> None:
    clock, q = VirtualClock(), make_queue(max_batch_size=4, max_queue_delay_microseconds=1_000_000)
    for i in range(6):
        push(q, clock, f"r{i}")
    assert ids(q.form_batch(clock.now())) == ["r0", "r1", "r2", "r3"]
    assert q.form_batch(clock.now()) is None and len(q) == 2


def test_otherwise_waits_until_the_oldest_waited_the_delay_then_goes_as_is() -> None:
    clock, q = VirtualClock(), make_queue(max_batch_size=8, preferred_batch_size=[8],
                                          max_queue_delay_microseconds=2000)
    push(q, clock, "a")
    clock.advance(1000 * US)
    push(q, clock, "b")
    clock.advance(500 * US)
    assert q.form_batch(clock.now()) is None
    assert q.next_ready_at(clock.now()) == pytest.approx(2000 * US)  # from the oldest, not the newest
    clock.set(q.next_ready_at(clock.now()))  # type: ignore[arg-type]
    assert q.next_ready_at(clock.now()) == clock.now()
    assert ids(q.form_batch(clock.now())) == ["a", "b"]
    assert q.next_ready_at(clock.now()) is None


def test_zero_delay_sends_whatever_is_queued() -> None:
    clock, q = VirtualClock(), make_queue(max_batch_size=8)
    push(q, clock, "a")
    assert ids(q.form_batch(clock.now())) == ["a"]


def test_batch_forms_from_the_head_in_arrival_order_higher_levels_first() -> None:
    clock, q = VirtualClock(), make_queue(max_batch_size=4, priority_levels=3, default_priority_level=2)
    levels = {"r0": 2, "r1": 3, "r2": 1, "r3": None, "r4": 1, "r5": 3}  # None: the default level (2)
    for rid, level in levels.items():
        push(q, clock, rid, priority_level=level)
        clock.advance(1 * US)
    assert q.depth_by_level() == {1: 2, 2: 2, 3: 2}
    assert ids(q.form_batch(clock.now())) == ["r2", "r4", "r0", "r3"]
    assert ids(q.form_batch(clock.now())) == ["r1", "r5"]


def test_full_queue_rejects_at_once() -> None:
    clock = VirtualClock()
    q = make_queue(max_batch_size=8, max_queue_delay_microseconds=10_000, priority_levels=2,
                   default_queue_policy={"max_queue_size": 2},
                   priority_queue_policy={2: {"max_queue_size": 0}})
    push(q, clock, "a")
    push(q, clock, "b")
    with pytest.raises(QueueFullError) as info:
        push(q, clock, "c")
    assert info.value.retry_after_s >= 1.0 and info.value.level == 1
    assert len(q) == 2 and "c" not in q
    push(q, clock, "d", priority_level=2)  # level 2 has its own (unbounded) queue policy
    q.cancel("a")
    push(q, clock, "c")  # room again
    assert len(q) == 3


def test_a_full_level_pushes_out_the_newest_request_of_the_user_holding_most() -> None:
    """One user filling a level no longer turns every other user away (429): the user holding the most,
    at least two more than the newcomer, loses their newest request, which gets the 429 instead."""
    clock = VirtualClock()
    q = make_queue(max_batch_size=8, default_queue_policy={"max_queue_size": 4})
    for i in range(4):
        push(q, clock, f"k{i}", "kid")
    push(q, clock, "a0", "alice")  # kid 4 vs alice 0: kid's newest goes
    (victim, refusal), = q.take_pushed_out()
    assert victim.request_id == "k3" and isinstance(refusal, QueueFullError) and "k3" not in q
    push(q, clock, "a1", "alice")  # kid 3 vs alice 1: still two more
    assert [v.request_id for v, _ in q.take_pushed_out()] == ["k2"]
    with pytest.raises(QueueFullError):
        push(q, clock, "a2", "alice")  # kid 2 vs alice 2: a turn must not go back and forth
    with pytest.raises(QueueFullError):
        push(q, clock, "k9", "kid")  # nobody holds more than the kid's own count + 1
    assert not q.take_pushed_out() and sorted(i.request_id for i in q) == ["a0", "a1", "k0", "k1"]


def test_a_request_put_back_after_it_ran_is_never_pushed_out() -> None:
    """A preempted request goes back into its queue; as its user's newest it was pushed out of a full level:
    a 429 in the middle of an answer that had streamed. The user's newest that never ran goes instead."""
    clock = VirtualClock()
    q = make_queue(max_batch_size=8, default_queue_policy={"max_queue_size": 4})
    for i in range(3):
        push(q, clock, f"k{i}", "kid")
    ran = push(q, clock, "k3", "kid")
    q.take(ran, clock.now())  # it runs, streams, and is preempted
    q.requeue_front(ran)
    push(q, clock, "a0", "alice")
    assert [v.request_id for v, _ in q.take_pushed_out()] == ["k2"] and "k3" in q
    only_ran = make_queue(max_batch_size=8, default_queue_policy={"max_queue_size": 2})
    for rid in ("r0", "r1"):
        item = push(only_ran, clock, rid, "kid")
        only_ran.take(item, clock.now())
        only_ran.requeue_front(item)
    with pytest.raises(QueueFullError):  # nothing of the kid's may go: the newcomer gets the 429
        push(only_ran, clock, "a0", "alice")


def test_reject_timeout_hands_the_request_back_and_it_never_batches() -> None:
    clock = VirtualClock()
    q = make_queue(max_batch_size=8, max_queue_delay_microseconds=5_000_000,
                   default_queue_policy={"timeout_action": "REJECT", "default_timeout_microseconds": SECOND})
    push(q, clock, "a")
    clock.advance(0.5)
    push(q, clock, "b")
    assert q.next_expiry_at() == pytest.approx(1.0)
    clock.set(0.99)
    assert q.expire(clock.now()) == [] and len(q) == 2
    clock.set(1.2)
    assert q.form_batch(clock.now()) is None  # b alone, within its delay window; a is gone
    assert ids(q.expire(clock.now())) == ["a"]  # found by form_batch, handed back once
    assert q.expire(clock.now()) == []
    clock.set(6.0)
    assert ids(q.expire(clock.now())) == ["b"]
    assert q.form_batch(clock.now()) is None and len(q) == 0


def test_delay_timeout_moves_the_request_behind_all_unexpired_ones() -> None:
    clock = VirtualClock()
    q = make_queue(max_batch_size=8, max_queue_delay_microseconds=50_000_000,
                   default_queue_policy={"timeout_action": "DELAY", "default_timeout_microseconds": SECOND})
    push(q, clock, "a")
    clock.set(0.5)
    push(q, clock, "b")
    clock.set(1.2)  # a expires (at 1.0) before c arrives, yet c still goes before a
    push(q, clock, "c")
    assert q.expire(clock.now()) == [] and len(q) == 3
    assert [i.request_id for i in q] == ["b", "c", "a"]
    clock.set(1.6)  # b expires: behind c (unexpired), after a (delayed first)
    assert q.expire(clock.now()) == []
    assert [i.request_id for i in q] == ["c", "a", "b"]
    assert ids(q.form_batch(clock.now(), max_size=1)) == ["c"]  # the head goes first
    clock.set(100.0)  # delayed requests never time out again: still queued, in the order they expired
    assert q.expire(clock.now()) == [] and [i.request_id for i in q] == ["a", "b"]
    assert ids(q.form_batch(clock.now())) == ["a", "b"]


def test_timeout_override_may_shorten_but_never_lengthen() -> None:
    clock = VirtualClock()
    q = make_queue(default_queue_policy={"default_timeout_microseconds": 1_000_000,
                                         "allow_timeout_override": True},
                   max_queue_delay_microseconds=10_000_000, max_batch_size=8)
    short = push(q, clock, "short", timeout_override_us=200_000)
    long = push(q, clock, "long", timeout_override_us=5_000_000)
    assert short.deadline_s == pytest.approx(0.2) and long.deadline_s == pytest.approx(1.0)
    clock.set(0.2)
    assert ids(q.expire(clock.now())) == ["short"]
    clock.set(1.0)
    assert ids(q.expire(clock.now())) == ["long"]
    # No default timeout: any positive override shortens "forever".
    q2 = make_queue(default_queue_policy={"allow_timeout_override": True})
    assert push(q2, clock, "x", timeout_override_us=300_000).deadline_s == pytest.approx(1.3)
    assert push(q2, clock, "y").deadline_s is None


def test_no_timeout_override_when_not_allowed() -> None:
    clock = VirtualClock()
    q = make_queue(default_queue_policy={"default_timeout_microseconds": 1_000_000})
    assert push(q, clock, "a", timeout_override_us=100_000).deadline_s == pytest.approx(1.0)
    from homeai.policy.schema import QueuePolicy
    assert effective_timeout_us(QueuePolicy(default_timeout_microseconds=0), 5) == 0


def test_cancelled_requests_never_come_out() -> None:
    clock = VirtualClock()
    q = make_queue(max_batch_size=4, default_queue_policy={"default_timeout_microseconds": 1_000_000})
    items = [push(q, clock, f"r{i}") for i in range(6)]
    assert q.cancel("r1") is items[1] and q.cancel("r1") is None and q.cancel("nope") is None
    q.cancel("r3")  # other threads post cancels to the owner's inbox; only the owner mutates the queue
    assert ids(q.form_batch(clock.now())) == ["r0", "r2", "r4", "r5"]
    assert len(q) == 0 and "r3" not in q
    llm = make_queue("llm")
    for i in range(3):
        push(llm, clock, f"x{i}")
    llm.cancel("x0")
    assert admit(llm, clock.now()).request_id == "x1"  # type: ignore[union-attr]
    push(q, clock, "late")
    q.cancel("late")
    clock.set(5.0)
    assert q.expire(clock.now()) == []  # a cancelled request is not handed back as a timeout


def test_llm_delay_window_holds_prefills_so_they_share_a_step() -> None:
    clock, q = VirtualClock(), make_queue("llm", max_batch_size=4, max_queue_delay_microseconds=5000)
    push(q, clock, "a")
    clock.advance(1000 * US)
    push(q, clock, "b")
    assert admit(q, clock.now()) is None
    assert q.next_ready_at(clock.now()) == pytest.approx(5000 * US)
    clock.set(5000 * US)
    assert admit(q, clock.now()).request_id == "a"  # type: ignore[union-attr]
    assert admit(q, clock.now()).request_id == "b"  # type: ignore[union-attr]  # same window
    clock.advance(1000 * US)
    push(q, clock, "c")
    assert admit(q, clock.now()) is None  # a new window for c
    for rid in "def":
        push(q, clock, rid)
    assert admit(q, clock.now()).request_id == "c"  # type: ignore[union-attr]  # 4 queued


def test_admission_respects_levels_then_asks_the_picker_among_users_by_head_arrival() -> None:
    clock, q = VirtualClock(), make_queue("llm", priority_levels=2)
    push(q, clock, "low", "zed", priority_level=2)
    for rid, user in [("a1", "ann"), ("b1", "bob"), ("a2", "ann"), ("c1", "cy")]:
        clock.advance(US)
        push(q, clock, rid, user)
    offered: list[list[str]] = []

    def pick(users: list[str]) -> str:
        offered.append(users)
        return users[-1]

    assert admit(q, clock.now(), pick).request_id == "c1"  # type: ignore[union-attr]
    assert admit(q, clock.now(), pick).request_id == "b1"  # type: ignore[union-attr]
    assert offered == [["ann", "bob", "cy"], ["ann", "bob"]]
    assert q.users_queued() == {"ann", "zed"} and q.num_queued_for("ann") == 2
    assert [admit(q, clock.now()).request_id for _ in range(3)] == ["a1", "a2", "low"]  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        push(q, clock, "x", "ann")
        admit(q, clock.now(), lambda users: "nobody")


def test_peek_take_and_requeue_front_keep_one_entry_per_request() -> None:
    clock, q = VirtualClock(), make_queue("llm")
    for i in range(3):
        push(q, clock, f"r{i}", user=f"u{i % 2}")
    item = q.peek_for_admission(clock.now(), lambda users: users[1])
    assert item is not None and item.request_id == "r1"
    q.take(item, clock.now())
    with pytest.raises(ValueError):
        q.take(item, clock.now())
    q.requeue_front(item)  # no KV room after all: back at the head of its level
    assert [i.request_id for i in q] == ["r1", "r0", "r2"] and len(q) == 3
    with pytest.raises(ValueError):
        q.push(QueuedItem("r0", "u0"), clock.now())


def test_policy_swap_keeps_queued_requests_and_applies_new_limits() -> None:
    clock = VirtualClock()
    q = make_queue(max_batch_size=8, max_queue_delay_microseconds=1_000_000,
                   default_queue_policy={"max_queue_size": 4})
    for i in range(3):
        push(q, clock, f"r{i}")
    q.set_policy(ClassPolicy(kind="embedding", model="m", max_batch_size=2,
                             default_queue_policy={"max_queue_size": 2}))  # type: ignore[arg-type]
    with pytest.raises(QueueFullError):
        push(q, clock, "r3")
    assert ids(q.form_batch(clock.now())) == ["r0", "r1"]  # new max size, no delay: at once
    assert ids(q.form_batch(clock.now())) == ["r2"]


def test_many_cancellations_keep_memory_bounded() -> None:
    clock, q = VirtualClock(), make_queue("llm")
    items = [push(q, clock, f"r{i}", user=f"u{i % 3}") for i in range(1000)]
    for item in items[:900]:
        q.cancel(item.request_id)
    level = q._levels[1]
    assert len(q) == 100 and len(level.main) < 300 and sum(map(len, level.user_main.values())) < 300
    assert [i.request_id for i in q] == [f"r{i}" for i in range(900, 1000)]


# ---- after the delay window; a delayed request and other users; counter order across users --------
def test_after_the_delay_window_everything_pending_goes_up_to_max_batch_size() -> None:
    """Triton: once the oldest has waited the window, all that is pending goes (up to the max), not a
    batch trimmed to the largest preferred size that fits (before: 8 of the 10, then 2 more later)."""
    clock, q = VirtualClock(), make_queue(max_batch_size=16, preferred_batch_size=[4, 8],
                                          max_queue_delay_microseconds=2000)
    for i in range(6):
        push(q, clock, f"r{i}")
    assert ids(q.form_batch(clock.now())) == ["r0", "r1", "r2", "r3"]  # a preferred size: at once
    clock.advance(1000 * US)
    for i in range(6, 14):
        push(q, clock, f"r{i}")
    clock.advance(1000 * US)  # r4 has waited the window: all ten pending go together
    assert ids(q.form_batch(clock.now())) == [f"r{i}" for i in range(4, 14)]
    for i in range(20):
        push(q, clock, f"s{i}")
    clock.advance(2000 * US)
    assert ids(q.form_batch(clock.now())) == [f"s{i}" for i in range(16)]  # the max caps it


def test_a_delayed_request_goes_behind_another_users_fresh_request_whatever_the_counters() -> None:
    """An LLM class with DELAY: ann's request timed out, so bob's fresh one is admitted first even
    though fairness would pick ann (lowest counter). Before, the picker was offered both users."""
    clock = VirtualClock()
    q = make_queue("llm", default_queue_policy={"timeout_action": "DELAY", "default_timeout_microseconds": SECOND})
    push(q, clock, "old", "ann")
    clock.set(2.0)
    push(q, clock, "fresh", "bob")
    offered: list[list[str]] = []

    def prefer_ann(users: list[str]) -> str:
        offered.append(users)
        return "ann" if "ann" in users else users[0]

    assert admit(q, clock.now(), prefer_ann).request_id == "fresh"  # type: ignore[union-attr]
    assert admit(q, clock.now(), prefer_ann).request_id == "old"  # type: ignore[union-attr]
    assert offered == [["bob"], ["ann"]]


def test_embedding_batches_form_in_counter_order_across_users() -> None:
    """One user's 250 inputs queued before another user's single query: with a fairness counter the
    query is in the first batch, and the flood's inputs follow in counter order."""
    clock = VirtualClock()
    q = ClassQueue("embedding", ClassPolicy.model_validate(
        {"kind": "embedding", "model": "m", "max_batch_size": 32, "max_queue_delay_microseconds": 0}),
        VirtualTokenCounter(w_in=1.0, w_out=0.0))
    for i in range(250):
        push(q, clock, f"idx{i}", "indexer", cost=200)
    push(q, clock, "query", "alice", cost=12)
    first = ids(q.form_batch(clock.now()))
    assert len(first) == 32 and first[0] == "idx0" and "query" in first[:2]
    assert first[2:] == [f"idx{i}" for i in range(1, 31)]
