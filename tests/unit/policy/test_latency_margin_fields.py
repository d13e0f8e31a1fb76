"""Latency margins in the policy: a policy says, per interactive class, how much lower-class work may lengthen its steps
(``latency_margin``), whether the background batches between its steps count too
(``margin_between_steps``), and how long a background-only step may last while it is active
(``arrival_step_fraction``); each is validated at its key path, and the default policy keeps voice at
quiet-house speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from homeai.policy.loader import PolicyError, load_policy, parse_policy
from homeai.policy.schema import DEFAULT_ARRIVAL_STEP_FRACTION

DEFAULT = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"

BASE = """\
classes:
  voice:
    kind: llm
    model: m
    priority: 0
    targets: {ttft_ms: 300, itl_ms: 100}
  summarize:
    kind: llm
    model: m
    priority: 2
    background: true
"""


def errors_of(text: str) -> dict[str, str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.yaml")
    return dict(info.value.errors)


def test_the_default_policy_keeps_voice_at_quiet_house_speed_and_protects_chat() -> None:
    policy = load_policy(DEFAULT)
    voice, chat = policy.classes["voice"], policy.classes["chat"]
    assert voice.latency_margin is not None and voice.latency_margin <= 0.2
    assert voice.margin_between_steps  # background batches between its steps count too
    assert voice.arrival_fraction is not None and voice.arrival_fraction * voice.targets.ttft_ms <= 30
    assert chat.latency_margin is not None and not chat.margin_between_steps
    for name in ("embedding", "indexing", "summarize"):
        assert policy.classes[name].latency_margin is None


def test_the_fields_parse_and_the_arrival_fraction_has_a_default() -> None:
    voice = parse_policy(BASE.replace("priority: 0", "priority: 0\n    latency_margin: 0.2")).classes["voice"]
    assert voice.latency_margin == 0.2 and not voice.margin_between_steps
    assert voice.arrival_fraction == DEFAULT_ARRIVAL_STEP_FRACTION
    fields = "priority: 0\n    latency_margin: 0\n    margin_between_steps: true\n    arrival_step_fraction: 0.3"
    voice = parse_policy(BASE.replace("priority: 0", fields)).classes["voice"]
    assert voice.latency_margin == 0 and voice.margin_between_steps and voice.arrival_fraction == 0.3
    assert parse_policy(BASE).classes["voice"].arrival_fraction is None  # no margin: the older sizing


@pytest.mark.parametrize(("insert", "path", "message"), [
    ("    latency_margin: -0.1\n", "classes.voice.latency_margin", "greater than or equal to 0"),
    ("    latency_margin: '0.1'\n", "classes.voice.latency_margin", "number"),
    ("    latency_margin: 0.1\n    arrival_step_fraction: 0\n", "classes.voice.arrival_step_fraction",
     "greater than 0"),
    ("    arrival_step_fraction: 0.1\n", "classes.voice.arrival_step_fraction", "only with latency_margin"),
    ("    margin_between_steps: true\n", "classes.voice.margin_between_steps", "only with latency_margin"),
])
def test_bad_values_name_their_key(insert: str, path: str, message: str) -> None:
    errs = errors_of(BASE.replace("    priority: 0\n", "    priority: 0\n" + insert))
    assert message in errs[path]


def test_a_margin_belongs_to_an_interactive_llm_class_and_the_arrival_bound_needs_a_ttft_target() -> None:
    errs = errors_of(BASE + "    latency_margin: 0.1\n")
    assert "only for interactive llm classes" in errs["classes.summarize.latency_margin"]
    no_ttft = BASE.replace("targets: {ttft_ms: 300, itl_ms: 100}", "targets: {itl_ms: 100}")
    fields = "priority: 0\n    latency_margin: 0.1\n    arrival_step_fraction: 0.1"
    errs = errors_of(no_ttft.replace("priority: 0", fields))
    assert "needs targets.ttft_ms" in errs["classes.voice.arrival_step_fraction"]
    embedding = "  search: {kind: embedding, model: e, latency_margin: 0.1}\n"
    assert "only for interactive llm classes" in errors_of(BASE + embedding)["classes.search.latency_margin"]
