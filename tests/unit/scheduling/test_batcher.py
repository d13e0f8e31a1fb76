"""The one batcher for the device, on virtual time: an interactive embedding batch runs as soon as it
is ready, alternating with LLM steps; background embedding fills idle time and ITL slack only, with
min_share as its floor; batches are cut short while interactive work is around; next_wake_s."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml
from engine_helpers import FakeRunner, assert_engine_empty, make_requests

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import (
    BACKGROUND_BATCH_TTFT_FRACTION,
    INTERACTIVE_HORIZON_S,
    LLM_STEP,
    SHARE_WINDOW_S,
    Batcher,
    EmbedWork,
)
from homeai.scheduling.class_queue import QueuedItem
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock

ITL_TARGET_S = 0.1


def make_policy(**classes: dict[str, Any]) -> Policy:
    """chat (LLM, TTFT 300 ms / ITL 100 ms), search (interactive embedding), indexing (background
    embedding, min_share 0.1); ``classes`` override fields per class."""
    fields: dict[str, dict[str, Any]] = {
        "chat": {"kind": "llm", "priority": 1, "targets": {"ttft_ms": 300, "itl_ms": ITL_TARGET_S * 1000}},
        "search": {"kind": "embedding", "priority": 1, "max_batch_size": 8, "max_queue_delay_microseconds": 2000},
        "indexing": {"kind": "embedding", "priority": 2, "background": True, "min_share": 0.1,
                     "max_batch_size": 16, "preferred_batch_size": [16], "max_queue_delay_microseconds": 50_000},
    }
    for name, extra in classes.items():
        fields[name] = {**fields[name], **extra}
    doc = {"classes": {name: {"model": "m", **f} for name, f in fields.items()}}
    return parse_policy(yaml.safe_dump(doc), source="test-policy")


class Device:
    """The device loop on virtual time: asks the batcher, runs the work at a fixed cost, records it."""

    def __init__(self, policy: Policy, llm_step_s: float = 0.02,
                 batch_s: dict[str, tuple[float, float]] | None = None) -> None:
        self.clock = VirtualClock()
        self.sched = ClassScheduler(BlockManager(256, 4), policy, self.clock)
        self.batcher = Batcher(policy, self.sched, self.clock)
        self.runner = FakeRunner()
        self.llm_step_s = llm_step_s
        # class -> (seconds per batch, seconds per input)
        self.batch_s = {"search": (0.005, 0.0), "indexing": (0.03, 0.0), **(batch_s or {})}
        self.log: list[tuple[str, float, float, int]] = []  # (class or "llm", start, end, items)
        self._ids = itertools.count()

    def add_chat(self, max_tokens: int = 50) -> Sequence:
        (seq,) = make_requests(1, 8, max_tokens, first_id=next(self._ids))
        seq.class_name = "chat"
        self.sched.add(seq)
        return seq

    def push(self, class_name: str, n: int) -> None:
        for _ in range(n):
            self.batcher.push_embedding(class_name, QueuedItem(f"e{next(self._ids)}", "u"))

    def run_once(self) -> str | None:
        """One iteration of the device loop; returns what ran ("llm", a class name) or None (idle)."""
        work = self.batcher.take_next()
        start = self.clock.now()
        if work == LLM_STEP:
            plan = self.sched.schedule()
            if plan.is_empty:
                return None
            self.clock.advance(self.llm_step_s)
            self.sched.update(plan, self.runner.execute(plan, self.sched.seqs))
            self.batcher.record(LLM_STEP, start, self.clock.now())
            self.log.append((LLM_STEP, start, self.clock.now(), 0))
            return LLM_STEP
        if isinstance(work, EmbedWork):
            base_s, per_input_s = self.batch_s[work.class_name]
            self.clock.advance(base_s + per_input_s * len(work.items))
            self.batcher.record(work.class_name, start, self.clock.now(), len(work.items))
            self.log.append((work.class_name, start, self.clock.now(), len(work.items)))
            return work.class_name
        return None

    def llm_step_ends(self) -> list[float]:
        return [end for what, _, end, _ in self.log if what == LLM_STEP]


def test_a_ready_interactive_embedding_batch_runs_before_the_next_llm_step() -> None:
    dev = Device(make_policy())
    dev.add_chat()
    assert dev.run_once() == LLM_STEP
    dev.push("search", 1)
    assert dev.run_once() == LLM_STEP  # its 2 ms delay window is still open
    dev.clock.advance(0.002)
    assert dev.run_once() == "search"  # ready: it goes before the next LLM step
    dev.push("search", 8)  # a full batch is ready at once
    assert dev.run_once() == LLM_STEP  # but one LLM step goes between two embedding batches
    assert dev.run_once() == "search" and dev.log[-1][3] == 8


def test_embedding_batches_and_llm_steps_alternate_so_neither_starves() -> None:
    dev = Device(make_policy())
    chat = dev.add_chat(max_tokens=200)
    dev.push("search", 80)  # always a full batch ready
    ran = [dev.run_once() for _ in range(12)]
    assert ran == ["search", LLM_STEP] * 6
    assert chat.num_output_tokens == 6  # a token every other iteration, never stalled by the flood
    dev.sched.abort(chat.request_id)
    assert [dev.run_once() for _ in range(5)] == ["search"] * 4 + [None]  # LLM idle: embeddings back to back
    assert_engine_empty(dev.sched)


def test_background_embedding_runs_when_the_device_is_idle() -> None:
    dev = Device(make_policy(indexing={"min_share": 0.0}), batch_s={"indexing": (0.01, 0.0)})
    dev.push("indexing", 40)
    assert [dev.run_once() for _ in range(3)] == ["indexing"] * 2 + [None]  # 16 + 16; 8 wait their window
    dev.clock.advance(0.05)
    assert dev.run_once() == "indexing" and dev.log[-1][3] == 8


def test_background_embedding_fills_itl_slack_without_making_a_token_late() -> None:
    dev = Device(make_policy(indexing={"min_share": 0.0}), batch_s={"indexing": (0.03, 0.0)})
    chat = dev.add_chat(max_tokens=30)
    dev.push("indexing", 16 * 40)
    while not chat.status.is_finished:
        dev.run_once()
    ran = [what for what, *_ in dev.log]
    assert ran.count("indexing") >= 10  # it ran between decode steps...
    ends = dev.llm_step_ends()
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    assert max(gaps) <= ITL_TARGET_S + 1e-9  # ...and never delayed a token past the ITL target
    assert_engine_empty(dev.sched)


def test_a_background_batch_that_does_not_fit_the_slack_waits_until_the_llm_is_idle() -> None:
    dev = Device(make_policy(indexing={"min_share": 0.0}), batch_s={"indexing": (0.09, 0.0)})
    chat = dev.add_chat(max_tokens=30)
    dev.push("indexing", 16 * 10)
    while not chat.status.is_finished:
        dev.run_once()
    ran = [what for what, *_ in dev.log]
    assert ran.count("indexing") <= 1  # only the first, before its cost was known
    idle = [dev.run_once() for _ in range(3)]
    assert idle == ["indexing"] * 3
    assert_engine_empty(dev.sched)


def test_min_share_forces_a_starved_background_class() -> None:
    dev = Device(make_policy(), batch_s={"indexing": (0.2, 0.0)})  # never fits the ITL slack
    chat = dev.add_chat(max_tokens=10_000)
    dev.push("indexing", 3)  # fewer than the preferred 16, its 50 ms window still open
    assert dev.run_once() == LLM_STEP  # a cold start owes nothing: the share refills from now on
    # owed its share: runs before its window closes (one input: its cost is not known yet)
    assert dev.run_once() == "indexing" and dev.log[-1][3] == 1
    dev.push("indexing", 16 * 200)
    for _ in range(2000):
        dev.run_once()
    window_start = dev.clock.now() - SHARE_WINDOW_S
    busy = {LLM_STEP: 0.0, "indexing": 0.0}
    for what, start, end, _ in dev.log:
        if start >= window_start:
            busy[what] += end - start
    share = busy["indexing"] / (busy["indexing"] + busy[LLM_STEP])
    assert 0.1 <= share <= 0.15  # its floor, no more: it never fits the slack
    dev.sched.abort(chat.request_id)
    assert_engine_empty(dev.sched)


def test_a_background_class_that_starts_late_repays_no_debt_in_back_to_back_batches() -> None:
    """Chat decodes alone for 10 s, then indexing floods in (200 ms batches: never within the ITL
    slack). Its share is a rate from then on: no two indexing batches back to back, and about its 10 %
    of the device over the next 10 s. Before, the 5 s window without indexing counted as a debt, repaid
    at once by three forced batches in a row (600 ms without a chat token)."""
    dev = Device(make_policy(), batch_s={"indexing": (0.2, 0.0)})
    chat = dev.add_chat(max_tokens=100_000)
    while dev.clock.now() < 10.0:
        dev.run_once()
    dev.push("indexing", 16 * 100)
    start = dev.clock.now()
    while dev.clock.now() < start + 10.0:
        dev.run_once()
    ran = [what for what, s, _, _ in dev.log if s >= start]
    assert not any(a == b == "indexing" for a, b in zip(ran, ran[1:], strict=False))
    busy = sum(end - s for what, s, end, _ in dev.log if what == "indexing" and s >= start)
    assert 0.08 <= busy / (dev.clock.now() - start) <= 0.13
    dev.sched.abort(chat.request_id)
    assert_engine_empty(dev.sched)


def test_a_single_search_query_is_not_stuck_behind_another_users_flood() -> None:
    """The indexer's 250 inputs sent to the interactive embedding class, then alice's one query: her
    query is in the first batch (per-user counters), not the 32nd behind them (one shared FIFO made her
    wait for the whole flood)."""
    dev = Device(make_policy(search={"max_queue_delay_microseconds": 0}))
    for i in range(250):
        dev.batcher.push_embedding("search", QueuedItem(f"idx{i}", "indexer", cost=200))
    dev.batcher.push_embedding("search", QueuedItem("query", "alice", cost=12))
    work = dev.batcher.take_next()
    assert isinstance(work, EmbedWork) and "query" in [item.request_id for item in work.items]


def test_background_batches_are_cut_short_while_interactive_work_is_recent() -> None:
    """With a measured cost per input, a background batch costs at most BACKGROUND_BATCH_TTFT_FRACTION
    of the tightest TTFT target (chat: 300 ms) while interactive work was seen recently."""
    per_input_s = 0.01
    dev = Device(make_policy(indexing={"min_share": 0.0}), batch_s={"indexing": (0.0, per_input_s)})
    dev.push("indexing", 16 * 4)
    assert dev.run_once() == "indexing" and dev.log[-1][3] == 16  # 10 ms per input measured
    chat = dev.add_chat(max_tokens=1)
    while not chat.status.is_finished:
        dev.run_once()
    assert dev.run_once() == "indexing"
    budget_s = BACKGROUND_BATCH_TTFT_FRACTION * 0.300
    n = dev.log[-1][3]
    assert 1 <= n < 16 and n * per_input_s <= budget_s + 1e-9 < (n + 1) * per_input_s  # as many as fit
    dev.clock.advance(INTERACTIVE_HORIZON_S + 1)
    assert dev.run_once() == "indexing" and dev.log[-1][3] == 16  # a quiet house: full batches
    assert_engine_empty(dev.sched)


def test_the_first_background_batch_while_the_house_is_active_is_one_input() -> None:
    """Its cost per input is not known yet, and a full batch can take seconds on a CPU: while chat runs,
    the first indexing batch is a single input; once measured, batches fit the TTFT fraction."""
    dev = Device(make_policy(indexing={"min_share": 0.0}), batch_s={"indexing": (0.0, 0.001)})
    chat = dev.add_chat(max_tokens=1000)
    assert dev.run_once() == LLM_STEP
    dev.push("indexing", 16 * 4)
    while dev.run_once() != "indexing":
        pass
    assert dev.log[-1][3] == 1
    while dev.run_once() != "indexing":
        pass
    assert 1 < dev.log[-1][3] <= BACKGROUND_BATCH_TTFT_FRACTION * 0.300 / 0.001 + 1e-6
    dev.sched.abort(chat.request_id)
    assert_engine_empty(dev.sched)


def test_next_wake_is_the_earliest_window_close_or_timeout() -> None:
    policy = make_policy(chat={"max_queue_delay_microseconds": 5000},
                         indexing={"default_queue_policy": {"default_timeout_microseconds": 1500}})
    dev = Device(policy)
    assert dev.batcher.next_wake_s() is None
    dev.clock.set(0.010)
    dev.add_chat()
    assert dev.batcher.next_wake_s() == pytest.approx(0.015)  # the chat delay window closes
    dev.clock.set(0.011)
    dev.push("search", 1)
    assert dev.batcher.next_wake_s() == pytest.approx(0.013)  # the search window closes first
    dev.clock.set(0.0115)
    dev.push("indexing", 1)
    assert dev.batcher.next_wake_s() == pytest.approx(0.013)  # its timeout (0.0130) ties the window
    dev.clock.set(0.013)
    assert dev.batcher.next_wake_s() == pytest.approx(0.013)  # ready now: wake now
    assert dev.run_once() == "search"
    assert [name for name, _ in dev.batcher.expire_embeddings()] == ["indexing"]
    assert dev.batcher.next_wake_s() == dev.clock.now()  # the chat window closed during that batch
