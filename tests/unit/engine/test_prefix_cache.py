"""Prefix caching in the block manager: which blocks are found, shared, published, kept and evicted.

The logits side (a cache hit computes the same numbers as a cold run) is in test_prefix_logits.py.
"""

from __future__ import annotations

import pytest
from engine_helpers import FakeRunner, assert_engine_empty, drain, step

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.core.types import SamplingParams
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.fcfs import FCFSScheduler

BS = 4


def seq(sid: int, tokens: list[int], class_name: str = "chat") -> Sequence:
    return Sequence(sid, f"r{sid}", list(tokens), SamplingParams(temperature=0.0, max_tokens=4),
                    class_name=class_name)


def compute(bm: BlockManager, s: Sequence, num_tokens: int | None = None) -> int:
    """Admit ``s`` and pretend a step wrote its KV up to ``num_tokens`` (default: the whole prompt)."""
    cached = bm.lookup(s)
    end = s.num_tokens if num_tokens is None else num_tokens
    s.num_computed_tokens = bm.admit(s, end - cached)
    assert s.num_computed_tokens == cached
    s.num_computed_tokens = end
    bm.cache_blocks(s)
    return cached


def test_a_finished_prefix_is_found_again_up_to_the_token_where_it_diverges() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True, model="m")
    system = list(range(1, 11))  # 10 tokens: two full blocks, and two tokens in a third
    a = seq(0, system + [50, 51])
    assert compute(bm, a) == 0
    a_table = list(bm.block_table(0))
    bm.free(0)
    assert bm.num_free_blocks == 16  # cached blocks nobody holds are free to take
    assert bm.num_cached_blocks == 3  # 12 tokens: three full blocks published
    b = seq(1, system + [60, 61, 62])  # diverges inside the third block, after two of its tokens
    assert compute(bm, b) == 10
    assert bm.block_table(1)[:2] == a_table[:2]
    assert bm.block_table(1)[2] != a_table[2]  # a published block is not written into: its 2 slots are copied
    assert bm.take_copy(1) == (a_table[2], bm.block_table(1)[2], 2)
    assert bm.take_copy(1) is None  # handed out once, to the plan that runs it
    bm.check_conserved()
    bm.release_pins()
    bm.free(1)
    assert_engine_empty(bm)


def test_a_repeated_prompt_takes_over_the_partly_written_block_its_first_run_left() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    prompt = list(range(1, 12))  # 11 tokens: two full blocks and 3 tokens in a third
    compute(bm, seq(0, prompt))
    tail = bm.block_table(0)[2]
    bm.free(0)
    again = seq(1, prompt)
    assert compute(bm, again) == 10  # all but the last token, which must run to give logits
    assert bm.block_table(1)[2] == tail and bm.take_copy(1) is None  # no copy: the block is its own now
    other = seq(2, prompt[:9] + [99, 98])
    assert bm.lookup(other) == 8  # the tail is no longer offered: its slots are being written again
    bm.free(1)
    assert bm.lookup(other) == 9  # the second run's tail, whose first slot matches
    assert_engine_empty(bm)


def test_concurrent_sequences_share_blocks_and_free_them_independently() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq(0, list(range(1, 17)))
    compute(bm, a)  # a keeps running; its 4 full blocks are published
    b = seq(1, list(range(1, 13)) + [99, 98])
    assert compute(bm, b) == 12
    shared = bm.block_table(0)[:3]
    assert bm.block_table(1)[:3] == shared
    assert bm.usage == pytest.approx(5 / 16)  # a's 4 blocks and b's own last one: shared ones count once
    bm.free(0)
    bm.check_conserved()
    assert bm.evict(16) == 1  # only a's last block, published and now unreferenced; b's are held
    assert bm.block_table(1)[:3] == shared and bm.lookup(seq(2, list(range(1, 14)))) == 12
    bm.free(1)
    assert_engine_empty(bm)


def test_the_last_token_is_always_computed() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    compute(bm, seq(0, list(range(8))))
    bm.free(0)
    again = seq(1, list(range(8)))  # the same two full blocks: one reused, 3 slots of the second copied
    assert compute(bm, again) == 7
    bm.free(1)
    assert bm.num_cached_blocks == 2  # the recomputed copy was not published twice
    bm.release_pins()
    assert_engine_empty(bm)


def test_blocks_not_yet_written_are_never_published() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    a = seq(0, list(range(12)))
    bm.lookup(a)
    bm.admit(a, 12)  # planned, then aborted before the step wrote anything
    bm.free(0)
    assert bm.num_cached_blocks == 0
    b = seq(1, list(range(12)))
    compute(bm, b, num_tokens=6)  # a chunk of 6 written: only the first block is full
    assert bm.num_cached_blocks == 1
    bm.free(1)
    assert bm.lookup(seq(2, list(range(12)))) == 6  # the first block, and the 2 slots written in the second
    assert_engine_empty(bm)


def test_free_blocks_go_first_then_the_least_recently_used_cached_ones() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    compute(bm, seq(0, [1] * 8 + [2]))
    bm.free(0)
    compute(bm, seq(1, [3] * 8 + [4]))
    bm.free(1)
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 8  # and 2 tails of one written slot each
    compute(bm, seq(2, [7] * 12))  # 3 blocks: the 2 never used, then 1 evicted
    assert bm.stats.num_evictions == 1
    assert bm.lookup(seq(4, [1] * 8 + [2, 5])) == 8  # the oldest prefix lost its last block first
    assert bm.lookup(seq(5, [3] * 8 + [4, 5])) == 9
    bm.free(2)
    assert_engine_empty(bm)


def test_admission_counts_reused_blocks_nobody_holds_as_taken_from_the_pool() -> None:
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    compute(bm, seq(0, list(range(9))))  # 3 blocks, 2 full ones published
    bm.free(0)
    b = seq(1, list(range(9)) + [5, 6, 7, 8, 9, 10, 11])  # 16 tokens: 4 blocks, 2 of them cached
    assert bm.lookup(b) == 9  # and the tail's one written slot, taken over with its block
    assert bm.num_new_blocks(1, 16) == 2
    assert bm.can_allocate(1, 16)  # 2 cached (unreferenced) + the tail + 1 fresh = the 4-block pool
    assert not bm.can_allocate(1, 16, reserve=1)
    holder = seq(2, [42] * 4)
    compute(bm, holder, num_tokens=1)  # takes a fresh block: now 3 left
    assert bm.lookup(b) == 9 and not bm.can_allocate(1, 16)
    assert bm.can_allocate(1, 12)
    bm.free(2)
    assert_engine_empty(bm)


def test_hits_are_counted_by_class_once_per_request_and_models_never_share() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True, model="m1")
    compute(bm, seq(0, list(range(10)), "voice"))
    bm.free(0)
    compute(bm, seq(1, list(range(10)) + [77], "voice"))
    resumed = seq(2, list(range(10)) + [78], "chat")
    resumed.num_preemptions = 1  # a re-admission after preemption: not a household's repeat
    compute(bm, resumed)
    stats = bm.stats.snapshot()
    assert stats["voice"] == {"num_requests": 2, "num_hit_requests": 1, "num_prompt_tokens": 21,
                              "num_hit_tokens": 10, "token_hit_rate": 10 / 21, "request_hit_rate": 0.5}
    assert "chat" not in stats
    other = BlockManager(16, BS, enable_prefix_caching=True, model="m2")
    compute(other, seq(0, list(range(10))))
    other.free(0)
    assert other.lookup(seq(1, list(range(10)) + [1])) == 10
    assert bm.lookup(seq(3, list(range(10)) + [1])) == 8  # m1's tail of these tokens was taken over
    assert BlockManager(16, BS, model="m1").lookup(seq(4, list(range(10)))) == 0  # caching off


def test_check_conserved_catches_a_wrong_ref_count_or_hash() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    compute(bm, seq(0, list(range(9))))
    bm._ref[bm.block_table(0)[0]] += 1
    with pytest.raises(AssertionError):
        bm.check_conserved()
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    compute(bm, seq(0, list(range(9))))
    bm.free(0)
    bm._hash[next(b for b in bm._evictable if bm._hash[b] is not None)] = None
    with pytest.raises(AssertionError):
        bm.check_conserved()


def test_fcfs_reuses_a_prefix_and_plans_only_the_rest() -> None:
    bm = BlockManager(32, BS, enable_prefix_caching=True)
    sched = FCFSScheduler(bm, max_num_batched_tokens=64, max_num_seqs=4, clock=VirtualClock())
    runner = FakeRunner()
    system = list(range(1, 20))
    sched.add(seq(0, system + [30]))
    drain(sched, runner)
    sched.add(seq(1, system + [40, 41]))
    plan, _ = step(sched, runner)
    assert [(c.start, c.num_tokens) for c in plan.chunks] == [(19, 2)]  # 16 in whole blocks, 3 copied
    copy = plan.chunks[0].kv_copy  # from the 5th block seq 0 published (it still holds it: pinned)
    assert copy is not None and copy[1] == bm.block_table(1)[4] and copy[2] == 3
    drain(sched, runner)
    assert bm.stats.snapshot()["chat"]["num_hit_tokens"] == 19
    assert_engine_empty(sched)
