"""Two LLMs on one device under the one batcher, on virtual time: each model has its own KV pool and class
scheduler, and each iteration the model whose work has the best class claim steps (``ModelSet``).

Voice runs on a small model (a 10 ms step), chat and a background class on a large one (a 60 ms step). A
voice request is served before a chat request on the other model; chat on the large model fills the slack
voice's ITL target leaves and is never stalled for long; background work on the large model steps only
when nothing interactive needs the device, or on its min_share.
"""

from __future__ import annotations

import itertools
from typing import Any

import yaml
from engine_helpers import FakeRunner, assert_engine_empty, make_requests

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy
from homeai.scheduling.batcher import LLM_STEP, Batcher
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock
from homeai.scheduling.device import run_once
from homeai.scheduling.model_set import ModelSet

STEP_S = {"small": 0.010, "large": 0.060}


def make_policy(**classes: dict[str, Any]) -> Policy:
    fields: dict[str, dict[str, Any]] = {
        "voice": {"kind": "llm", "model": "small", "priority": 0, "targets": {"ttft_ms": 300, "itl_ms": 100}},
        "chat": {"kind": "llm", "model": "large", "priority": 1, "targets": {"ttft_ms": 1000, "itl_ms": 150}},
        "summarize": {"kind": "llm", "model": "large", "priority": 2, "background": True},
    }
    for name, extra in classes.items():
        fields[name] = {**fields[name], **extra}
    return parse_policy(yaml.safe_dump({"classes": fields}), source="two-models")


class Device:
    """Two class schedulers in a ModelSet, one batcher, the server's ``run_once``; a step of a model
    lasts ``STEP_S[model]`` on the virtual clock."""

    def __init__(self, policy: Policy) -> None:
        self.clock = VirtualClock()
        self.scheds = {m: ClassScheduler(BlockManager(64, 4), policy, self.clock, model=m) for m in STEP_S}
        self.batcher = Batcher(policy, ModelSet(dict(self.scheds)), self.clock)
        self.runner = FakeRunner()
        self.steps: list[tuple[str, float]] = []  # (model, end)
        self._ids = itertools.count()

    def add(self, class_name: str, max_tokens: int = 20, prompt_len: int = 8) -> Sequence:
        (seq,) = make_requests(1, prompt_len, max_tokens, first_id=next(self._ids))
        seq.class_name = class_name
        self.scheds[self.batcher.policy.classes[class_name].model].add(seq)
        return seq

    # the Device protocol of homeai.scheduling.device
    def apply_inbox(self) -> None: ...

    def fail_expired(self) -> None: ...

    def llm_step(self, model: str | None = None) -> bool:
        assert model is not None
        sched = self.scheds[model]
        plan = sched.schedule()
        if plan.is_empty:
            return False
        self.clock.advance(STEP_S[model])
        sched.update(plan, self.runner.execute(plan, sched.seqs))
        self.steps.append((model, self.clock.now()))
        return True

    def embed_batch(self, work: Any) -> None:
        raise AssertionError("no embedding classes here")

    def run(self, num: int) -> list[str]:
        ran = []
        for _ in range(num):
            if not run_once(self.batcher, self):
                break
            ran.append(self.batcher.step_model or "")
        return ran


def test_voice_on_the_small_model_is_served_before_chat_on_the_large_one() -> None:
    dev = Device(make_policy())
    chat = dev.add("chat", max_tokens=3)
    voice = dev.add("voice", max_tokens=3)
    assert dev.batcher.take_next() == LLM_STEP and dev.batcher.step_model == "small"
    dev.run(20)
    assert voice.first_token_s is not None and chat.first_token_s is not None
    assert voice.first_token_s == STEP_S["small"]  # voice's prompt went first, in its own model's step
    assert chat.first_token_s > voice.first_token_s
    for sched in dev.scheds.values():
        assert_engine_empty(sched)


def test_chat_fills_voices_slack_and_a_new_voice_request_waits_at_most_one_chat_step() -> None:
    dev = Device(make_policy())
    chat = dev.add("chat", max_tokens=200)
    dev.run(3)  # chat decodes on the large model
    voice = dev.add("voice", max_tokens=30)
    arrival = dev.clock.now()
    dev.run(40)
    assert voice.first_token_s is not None
    assert voice.first_token_s - arrival <= STEP_S["small"] + 1e-9  # admitted by the very next step
    # while voice decodes, chat steps in between: neither stream stalls past its ITL target
    voice_ends = [end for model, end in dev.steps if model == "small"]
    chat_ends = [end for model, end in dev.steps if model == "large" and end > arrival]
    assert len(chat_ends) >= 5
    assert max(b - a for a, b in itertools.pairwise(voice_ends)) <= 0.100 + 1e-9
    assert max(b - a for a, b in itertools.pairwise(chat_ends)) <= 0.150 + STEP_S["small"] + 1e-9
    assert chat.num_output_tokens > 3


def test_background_on_the_large_model_steps_only_when_voice_leaves_room() -> None:
    dev = Device(make_policy())
    summary = dev.add("summarize", max_tokens=50)
    voice = dev.add("voice", max_tokens=20)
    dev.run(20)  # voice's 20 tokens: a 60 ms background step would not fit in its ITL slack
    assert voice.status.is_finished
    assert summary.num_output_tokens == 0 and all(model == "small" for model, _ in dev.steps)
    dev.run(5)  # the device is idle for voice: background fills it
    assert summary.num_output_tokens == 5


def test_background_min_share_on_another_model_is_a_rate_not_starvation() -> None:
    # voice's margin spans the time between its steps: no slack for background, only its share
    dev = Device(make_policy(summarize={"min_share": 0.2},
                             voice={"latency_margin": 0.15, "margin_between_steps": True}))
    summary = dev.add("summarize", max_tokens=200)
    voice = dev.add("voice", max_tokens=200)
    while not voice.status.is_finished:
        dev.run(1)
    busy = {m: sum(STEP_S[m] for model, _ in dev.steps if model == m) for m in STEP_S}
    assert summary.num_output_tokens > 0
    share = busy["large"] / (busy["large"] + busy["small"])
    assert 0.1 <= share <= 0.3  # about its 20 % of the device while voice keeps it busy
