"""Prefix-cache hit rates by class reach /metrics and /v1/stats from the block manager's counters, the
way the gateway's snapshot carries them."""

from __future__ import annotations

from homeai.core.prefix_stats import PrefixCacheStats, merged_snapshot
from homeai.metrics.recorder import MetricsRecorder
from homeai.metrics.stats import build_stats


def snapshot() -> dict[str, object]:
    stats = PrefixCacheStats()
    stats.record("voice", 1500, 1488)
    stats.record("voice", 1510, 1488)
    stats.record("voice", 1520, 0)
    stats.record("chat", 40, 0)
    return {"classes": {"voice": {}, "chat": {}}, "prefix_cache": stats.snapshot(),
            "device": {"m": {"kv_usage": 0.1, "prefix_cached_blocks": 93, "prefix_evictions": 4}}}


def test_prometheus_exports_hit_counters_and_ratios_by_class() -> None:
    text = MetricsRecorder().prometheus_text(snapshot()).decode()
    for line in (
        'homeai_prefix_cache_query_tokens_total{class_name="voice"} 4530.0',
        'homeai_prefix_cache_hit_tokens_total{class_name="voice"} 2976.0',
        'homeai_prefix_cache_requests_total{class_name="voice"} 3.0',
        'homeai_prefix_cache_hit_requests_total{class_name="voice"} 2.0',
        'homeai_prefix_cache_hit_ratio{class_name="chat",unit="tokens"} 0.0',
        'homeai_prefix_cache_blocks{model="m"} 93.0',
        'homeai_prefix_cache_evictions_total{model="m"} 4.0',
    ):
        assert line in text, line
    assert 'homeai_prefix_cache_hit_ratio{class_name="voice",unit="requests"} 0.666' in text


def test_stats_document_has_a_prefix_entry_per_class() -> None:
    doc = build_stats(MetricsRecorder(), snapshot(), None)
    voice = doc["classes"]["voice"]["prefix_cache"]
    assert voice["hit_tokens"] == 2976 and voice["prompt_tokens"] == 4530 and voice["requests"] == 3
    assert abs(voice["token_hit_rate"] - 2976 / 4530) < 1e-9 and abs(voice["request_hit_rate"] - 2 / 3) < 1e-9
    assert doc["classes"]["chat"]["prefix_cache"]["hit_requests"] == 0
    assert doc["device"]["m"]["prefix_cached_blocks"] == 93


def test_a_class_served_by_two_models_counts_what_both_saw() -> None:
    """Each LLM has its own pool and counters; a policy that moves chat from model A to B leaves both with
    chat counts. The snapshot took the last pool's, so A's 100 requests vanished and the counter went down."""
    a, b = PrefixCacheStats(), PrefixCacheStats()
    for _ in range(100):
        a.record("chat", 100, 80)
    b.record("chat", 100, 0)
    b.record("voice", 40, 40)
    merged = merged_snapshot([a, b])
    assert merged["chat"]["num_requests"] == 101 and merged["chat"]["num_hit_tokens"] == 8000
    assert merged["chat"]["token_hit_rate"] == 8000 / 10100 and merged["voice"]["request_hit_rate"] == 1.0
    text = MetricsRecorder().prometheus_text({"prefix_cache": merged, "classes": {}, "device": {}}).decode()
    assert 'homeai_prefix_cache_requests_total{class_name="chat"} 101.0' in text
