"""The soak's figures read from what a real recorder exports: started vs finished from the Prometheus
text, KV blocks in use from the stats document, and both soak policies valid."""

from __future__ import annotations

import pytest

from homeai.bench.soak import kv_blocks_in_use, metered_counts
from homeai.bench.soak_policy import STORM_CLASS, soak_policy_yaml
from homeai.metrics.recorder import MetricsRecorder
from homeai.policy.loader import parse_policy


def test_started_and_finished_come_from_the_recorders_series() -> None:
    rec = MetricsRecorder()
    for rid, class_name in (("a", "chat"), ("b", "chat"), ("c", "indexing"), ("d", "storm")):
        rec.request_started(rid, "chat", class_name, "u", "m", 1)
    rec.finished("a", "ok", 3)
    rec.finished("b", "aborted", 1)
    rec.finished("d", "rejected", 0)
    started, finished = metered_counts(rec.prometheus_text().decode())
    assert started == 4
    assert finished == {"chat": {"ok": 1, "aborted": 1}, "storm": {"rejected": 1}}  # "c" is still in flight


def test_kv_blocks_in_use_adds_up_every_model() -> None:
    stats = {"device": {"a": {"kv_usage": 0.25, "kv_blocks": 8}, "b": {"kv_usage": 0.0, "kv_blocks": 100}}}
    assert kv_blocks_in_use(stats) == 2
    assert kv_blocks_in_use({"device": {}}) == 0


@pytest.mark.parametrize("variant", [0, 1])
def test_both_soak_policies_are_valid_and_differ(variant: int) -> None:
    policy = parse_policy(soak_policy_yaml(variant))
    other = parse_policy(soak_policy_yaml(variant + 1))
    assert {"voice", "chat", STORM_CLASS, "embedding", "indexing"} <= set(policy.classes)
    assert policy.classes[STORM_CLASS].max_running == 1
    assert policy != other
