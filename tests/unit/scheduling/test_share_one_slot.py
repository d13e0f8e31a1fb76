"""A background class's min_share keeps at most half the sequence slots: with ``max_num_seqs: 1`` (one request
at a time on a weak box) it kept the only one, and a voice request timed out behind the summaries."""

from __future__ import annotations

from pathlib import Path

import yaml
from engine_helpers import FakeRunner, step

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import SamplingParams
from homeai.policy.loader import parse_policy
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.clock import VirtualClock

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def test_voice_runs_next_with_one_slot_while_summaries_are_queued() -> None:
    doc = yaml.safe_load(DEFAULT_POLICY.read_text())
    doc["scheduler"]["max_num_seqs"] = 1
    clock = VirtualClock()
    sched = ClassScheduler(BlockManager(256, 16), parse_policy(yaml.safe_dump(doc), source="test"), clock)
    runner = FakeRunner()
    for i in range(20):
        sched.add(Sequence(i, f"s{i}", list(range(1, 65)), SamplingParams(temperature=0.0, max_tokens=30),
                           class_name="summarize", user="indexer"))
    step(sched, runner)
    voice = Sequence(99, "v", list(range(1, 21)), SamplingParams(temperature=0.0, max_tokens=8), class_name="voice",
                     user="kids")
    sched.add(voice)
    for _ in range(100):
        clock.advance(0.02)
        step(sched, runner)
        if voice.status.is_finished:
            break
    assert voice.status == SequenceStatus.FINISHED_LENGTH
