"""Prefix-cache hit counters by workload class, kept by the block manager and read by the metrics.

Counted once per request, at its first admission: a sequence resumed after preemption re-hits its own
blocks, which says nothing about how often households repeat a prefix, so it is left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class PrefixCounts:
    """What one class asked of the cache and what it found there."""

    num_requests: int = 0
    num_hit_requests: int = 0  # requests that reused at least one cached block
    num_prompt_tokens: int = 0
    num_hit_tokens: int = 0  # prompt tokens whose KV came from the cache (not computed)

    @property
    def token_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.num_hit_requests / self.num_requests if self.num_requests else 0.0

    def add(self, other: PrefixCounts) -> None:
        """Count ``other``'s too (the same class on another model's pool)."""
        self.num_requests += other.num_requests
        self.num_hit_requests += other.num_hit_requests
        self.num_prompt_tokens += other.num_prompt_tokens
        self.num_hit_tokens += other.num_hit_tokens

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self) | {"token_hit_rate": self.token_hit_rate, "request_hit_rate": self.request_hit_rate}


class PrefixCacheStats:
    """Counters by class plus the pool-wide eviction count. Written by the device thread only."""

    def __init__(self) -> None:
        self.by_class: dict[str, PrefixCounts] = {}
        self.num_evictions = 0  # cached blocks dropped to make room

    def record(self, class_name: str, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        counts = self.by_class.get(class_name)
        if counts is None:
            counts = self.by_class[class_name] = PrefixCounts()
        counts.num_requests += 1
        counts.num_hit_requests += num_hit_tokens > 0
        counts.num_prompt_tokens += num_prompt_tokens
        counts.num_hit_tokens += min(num_hit_tokens, num_prompt_tokens)

    def snapshot(self) -> dict[str, dict[str, float | int]]:
        """JSON-ready counters by class (safe to call from another thread: copies before reading)."""
        return {name: counts.as_dict() for name, counts in list(self.by_class.items())}


def merged_snapshot(stats: list[PrefixCacheStats]) -> dict[str, dict[str, float | int]]:
    """Counters by class over several pools (each LLM has its own): a class served by two models, one after
    the other (a policy moved it), counts what both saw; taking one pool's replaced the other's, and the
    Prometheus counter went down."""
    merged: dict[str, PrefixCounts] = {}
    for one in stats:
        for name, counts in list(one.by_class.items()):
            merged.setdefault(name, PrefixCounts()).add(counts)
    return {name: counts.as_dict() for name, counts in merged.items()}
