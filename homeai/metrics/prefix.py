"""Prefix-cache figures from a Gateway snapshot: Prometheus families for /metrics and a per-class entry
for /v1/stats.

The snapshot carries ``prefix_cache`` (class -> counters, as ``PrefixCacheStats.snapshot`` gives them)
and, per model under ``device``, ``prefix_cached_blocks`` and ``prefix_evictions``. Counters are
exported as counters (rate them in PromQL); the all-time hit ratios are gauges for a glance.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_COUNTERS = (  # (snapshot key, metric name, help)
    ("num_prompt_tokens", "homeai_prefix_cache_query_tokens", "Prompt tokens of admitted requests"),
    ("num_hit_tokens", "homeai_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache"),
    ("num_requests", "homeai_prefix_cache_requests", "Admitted requests (first admission only)"),
    ("num_hit_requests", "homeai_prefix_cache_hit_requests", "Requests that reused at least one cached block"),
)


def prefix_families(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """Hit counters and ratios by class; cached blocks and evictions by model."""
    by_class: dict[str, dict[str, Any]] = snapshot.get("prefix_cache") or {}
    for key, name, help_text in _COUNTERS:
        family = CounterMetricFamily(name, help_text, labels=["class_name"])
        for cls, counts in sorted(by_class.items()):
            family.add_metric([cls], float(counts.get(key, 0)))
        yield family
    ratio = GaugeMetricFamily("homeai_prefix_cache_hit_ratio", "Share of prompt tokens (unit=tokens) or of "
                              "requests (unit=requests) served from the prefix cache since start",
                              labels=["class_name", "unit"])
    for cls, counts in sorted(by_class.items()):
        ratio.add_metric([cls, "tokens"], float(counts.get("token_hit_rate", 0.0)))
        ratio.add_metric([cls, "requests"], float(counts.get("request_hit_rate", 0.0)))
    yield ratio
    blocks = GaugeMetricFamily("homeai_prefix_cache_blocks", "KV blocks published for reuse", labels=["model"])
    evictions = CounterMetricFamily("homeai_prefix_cache_evictions", "Cached blocks evicted to make room",
                                    labels=["model"])
    for model, d in sorted((snapshot.get("device") or {}).items()):
        if "prefix_cached_blocks" in d:
            blocks.add_metric([model], float(d["prefix_cached_blocks"]))
            evictions.add_metric([model], float(d.get("prefix_evictions", 0)))
    yield blocks
    yield evictions


def prefix_entry(snapshot: dict[str, Any], class_name: str) -> dict[str, Any]:
    """The /v1/stats ``prefix_cache`` entry of one class (zeros before its first admission)."""
    counts = (snapshot.get("prefix_cache") or {}).get(class_name) or {}
    return {"token_hit_rate": float(counts.get("token_hit_rate", 0.0)),
            "request_hit_rate": float(counts.get("request_hit_rate", 0.0)),
            "hit_tokens": int(counts.get("num_hit_tokens", 0)),
            "prompt_tokens": int(counts.get("num_prompt_tokens", 0)),
            "hit_requests": int(counts.get("num_hit_requests", 0)),
            "requests": int(counts.get("num_requests", 0))}
