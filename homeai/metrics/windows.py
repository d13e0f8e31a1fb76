"""Sliding windows on an injectable clock: latency samples (for p50/p99) and token rates.

Both are append-only deques pruned from the left as time passes, so an update from the event loop is
O(1) amortized and a query walks at most one window. A latency sample carries a weight: a delta that
brings n tokens at once adds one sample of ``gap / n`` with weight n instead of n equal samples.
"""

from __future__ import annotations

import math
from collections import deque


class LatencyWindow:
    """Weighted latency samples of the last ``window_s`` seconds (bounded to ``max_samples``)."""

    __slots__ = ("window_s", "_samples")

    def __init__(self, window_s: float = 60.0, max_samples: int = 20_000) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float, int]] = deque(maxlen=max_samples)  # (t, value_s, weight)

    def add(self, now: float, value_s: float, weight: int = 1) -> None:
        self._samples.append((now, value_s, weight))
        self._prune(now)

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        samples = self._samples
        while samples and samples[0][0] < horizon:
            samples.popleft()

    def count(self, now: float) -> int:
        """Weighted number of samples in the window."""
        self._prune(now)
        return sum(w for _, _, w in self._samples)

    def percentiles(self, now: float, qs: tuple[float, ...] = (0.5, 0.99)) -> list[float | None]:
        """Weighted percentiles (nearest rank) of the window; None for an empty window."""
        self._prune(now)
        if not self._samples:
            return [None for _ in qs]
        pairs = sorted((v, w) for _, v, w in self._samples)
        total = sum(w for _, w in pairs)
        out: list[float | None] = []
        for q in qs:
            rank = max(1.0, q * total)  # the smallest value whose cumulative weight reaches q of the total
            acc = 0
            value = pairs[-1][0]
            for v, w in pairs:
                acc += w
                if acc >= rank - 1e-9:
                    value = v
                    break
            out.append(value)
        return out


class RateWindow:
    """Token counts in ``bucket_s`` buckets over the last ``window_s``; rates over any shorter span."""

    __slots__ = ("window_s", "bucket_s", "_buckets", "total")

    def __init__(self, window_s: float = 60.0, bucket_s: float = 0.1) -> None:
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._buckets: deque[list[int]] = deque()  # [bucket index, count]
        self.total = 0  # all-time count

    def add(self, now: float, n: int) -> None:
        index = self._index(now)
        buckets = self._buckets
        if buckets and buckets[-1][0] == index:
            buckets[-1][1] += n
        else:
            buckets.append([index, n])
        self.total += n
        self._prune(now)

    def _index(self, t: float) -> int:
        return math.floor(t / self.bucket_s + 1e-9)  # 90.0 / 0.1 is 900, but 90.0 // 0.1 is 899

    def _prune(self, now: float) -> None:
        oldest = self._index(now - self.window_s)
        buckets = self._buckets
        while buckets and buckets[0][0] < oldest:
            buckets.popleft()

    def sum(self, now: float, span_s: float) -> float:
        """Tokens counted in the last ``span_s`` seconds (bucket resolution)."""
        self._prune(now)
        oldest = self._index(now - span_s)
        return sum(c for i, c in self._buckets if i > oldest)

    def rate(self, now: float, span_s: float, active_s: float | None = None) -> float:
        """Tokens per second over the last ``span_s``; ``active_s`` (time since the recorder started)
        shortens the divisor so that a fresh server does not under-report its first seconds."""
        divisor = span_s if active_s is None else max(min(span_s, active_s), self.bucket_s)
        return self.sum(now, span_s) / divisor

    def is_idle(self, now: float) -> bool:
        self._prune(now)
        return not self._buckets
