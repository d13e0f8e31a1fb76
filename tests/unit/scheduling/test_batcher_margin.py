"""The batcher under latency margins, on virtual time: background embedding batches fit the
gaps the planner predicts (its steps are bounded now, so the next one is no longer assumed to last 60 % of
the ITL target), a class whose margin spans the time between its steps (voice) keeps its tokens at
quiet-house pace, and a new chat request may wait behind a background batch only within its arrival
bound while its class already decodes."""

from __future__ import annotations

import itertools
from typing import Any

import yaml
from engine_helpers import assert_engine_empty, make_requests
from test_batcher import Device

from homeai.core.sequence import Sequence
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import LLM_STEP
from homeai.scheduling.step_budget import StepCostModel


def make_policy(**classes: dict[str, Any]) -> Policy:
    fields: dict[str, dict[str, Any]] = {
        "voice": {"kind": "llm", "priority": 0, "targets": {"ttft_ms": 300, "itl_ms": 100},
                  "latency_margin": 0.15, "margin_between_steps": True, "arrival_step_fraction": 0.1},
        "chat": {"kind": "llm", "priority": 1, "targets": {"ttft_ms": 1000, "itl_ms": 150},
                 "latency_margin": 0.15, "max_queue_delay_microseconds": 0},
        "indexing": {"kind": "embedding", "priority": 2, "background": True, "min_share": 0.0,
                     "max_batch_size": 16, "preferred_batch_size": [16], "max_queue_delay_microseconds": 0},
    }
    for name, extra in classes.items():
        fields[name] = {**fields[name], **extra}
    doc = {"classes": {name: {"model": "m", **f} for name, f in fields.items()}}
    return parse_policy(yaml.safe_dump(doc), source="test-policy")


class MarginDevice(Device):
    def __init__(self, policy: Policy) -> None:
        super().__init__(policy, llm_step_s=0.02, batch_s={"indexing": (0.03, 0.0)})
        self.sched.step_cost = StepCostModel(base_s=0.02, per_token_s=1e-6)  # what the device does
        self._seq_ids = itertools.count(1000)

    def add(self, class_name: str, max_tokens: int) -> Sequence:
        (seq,) = make_requests(1, 8, max_tokens, first_id=next(self._seq_ids))
        seq.class_name = class_name
        self.sched.add(seq, self.clock.now())
        return seq

    def token_gaps(self, seq: Sequence, run: int = 400) -> list[float]:
        ends = []
        for _ in range(run):
            before = seq.num_output_tokens
            what = self.run_once()
            if what == LLM_STEP and seq.num_output_tokens > before:
                ends.append(self.clock.now())
            if seq.status.is_finished:
                break
        return [b - a for a, b in itertools.pairwise(ends)]


def test_background_batches_fill_chats_itl_slack_by_the_predicted_step() -> None:
    """Chat (margin, ITL 150 ms) decodes; 30 ms indexing batches fill the gaps between its 20 ms steps up
    to its ITL slack: four of them per gap (before: at most two, the next step assumed to last 90 ms),
    and no chat token is late."""
    dev = MarginDevice(make_policy())
    chat = dev.add("chat", max_tokens=40)
    dev.push("indexing", 16 * 200)
    gaps = dev.token_gaps(chat)
    assert max(gaps) <= 0.150 + 1e-9
    assert sum(gaps) / len(gaps) >= 0.02 + 3 * 0.03  # at least three batches per gap on average
    dev.sched.abort(chat.request_id)
    assert_engine_empty(dev.sched)


def test_voice_tokens_keep_quiet_house_pace_when_its_margin_spans_the_gaps() -> None:
    """Voice decodes while indexing floods in: with margin_between_steps no 30 ms batch fits its 15 %
    margin, so its tokens come step after step (20 ms apart, as in a quiet house); without it, batches
    fill its ITL slack and its tokens come ~80 ms apart."""
    dev = MarginDevice(make_policy())
    dev.push("indexing", 16 * 200)
    assert dev.run_once() == "indexing"  # its cost is measured
    voice = dev.add("voice", max_tokens=30)
    gaps = dev.token_gaps(voice)
    assert max(gaps) <= 1.15 * 0.02 + 1e-9
    assert_engine_empty(dev.sched)

    dev = MarginDevice(make_policy(voice={"margin_between_steps": False}))
    dev.push("indexing", 16 * 200)
    assert dev.run_once() == "indexing"
    voice = dev.add("voice", max_tokens=30)
    gaps = dev.token_gaps(voice)
    assert max(gaps) <= 0.100 + 1e-9 and sum(gaps) / len(gaps) > 0.06
    assert_engine_empty(dev.sched)


def test_a_new_chat_request_waits_behind_background_only_within_its_arrival_bound() -> None:
    """Chat decodes, indexing fills its gaps; a new chat request (arrival bound 10 % of 1 s) may wait for
    background batches at most 100 ms before its prompt runs, instead of forcing an extra step at once.
    A voice request (none of its class running) never waits for one."""
    dev = MarginDevice(make_policy(chat={"arrival_step_fraction": 0.1}))
    chat = dev.add("chat", max_tokens=400)
    dev.push("indexing", 16 * 200)
    while dev.run_once() != LLM_STEP or "indexing" not in dev.batcher._cost_s:
        pass
    new = dev.add("chat", max_tokens=4)  # just after a chat step: its next one is ~120 ms away
    arrived = dev.clock.now()
    ran = []
    while new.num_output_tokens == 0:
        ran.append(dev.run_once())
    assert "indexing" in ran  # it did not force a step at once...
    assert dev.clock.now() - arrived <= 0.100 + 0.03 + 0.02 + 1e-9  # ...nor waited past its bound
    voice = dev.add("voice", max_tokens=2)
    assert dev.run_once() == LLM_STEP and voice.num_output_tokens == 1
    for seq in (chat, new, voice):
        dev.sched.abort(seq.request_id)
    assert_engine_empty(dev.sched)
