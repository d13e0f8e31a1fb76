"""Sliding windows on an injectable clock: latency samples (for p50/p99) and token rates.

Both are deques of time buckets pruned from the left as time passes, so an update from the event
loop is O(1) amortized and a query walks at most one window. A latency sample carries a weight: a
delta that brings n tokens at once adds one sample of ``gap / n`` with weight n.
"""

from __future__ import annotations

import math
from collections import deque


class LatencyWindow:
    """Latency samples of the last ``window_s`` seconds as counts per log-spaced bin, per second.

    Values are binned with a ratio of ``1 + 2 * REL_ERROR`` (a reported percentile is within ±1 %
    of the true sample), so an update is one log and a dict increment, and a query merges at most
    ``window_s`` small dicts: cheap at any token rate, which a sorted list of raw samples is not.
    """

    REL_ERROR = 0.01
    _LOG_RATIO = math.log1p(2 * REL_ERROR)
    _ZERO_BIN = -(10**9)  # gaps of (almost) nothing: tokens delivered together

    __slots__ = ("window_s", "_seconds")

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._seconds: deque[tuple[int, dict[int, int]]] = deque()  # (whole second, {bin: weight})

    def add(self, now: float, value_s: float, weight: int = 1) -> None:
        second = math.floor(now)
        seconds = self._seconds
        if not seconds or seconds[-1][0] != second:
            seconds.append((second, {}))
            self._prune(now)
        bins = seconds[-1][1]
        b = self._ZERO_BIN if value_s <= 1e-9 else math.floor(math.log(value_s) / self._LOG_RATIO)
        bins[b] = bins.get(b, 0) + weight

    def _prune(self, now: float) -> None:
        oldest = math.floor(now - self.window_s)
        seconds = self._seconds
        while seconds and seconds[0][0] < oldest:
            seconds.popleft()

    def _merged(self, now: float) -> dict[int, int]:
        self._prune(now)
        merged: dict[int, int] = {}
        for _, bins in self._seconds:
            for b, w in bins.items():
                merged[b] = merged.get(b, 0) + w
        return merged

    def count(self, now: float) -> int:
        """Weighted number of samples in the window."""
        return sum(self._merged(now).values())

    def percentiles(self, now: float, qs: tuple[float, ...] = (0.5, 0.99)) -> list[float | None]:
        """Weighted percentiles (nearest rank, ±1 %) of the window; None for an empty window."""
        merged = self._merged(now)
        if not merged:
            return [None for _ in qs]
        pairs = sorted(merged.items())
        total = sum(merged.values())
        out: list[float | None] = []
        for q in qs:
            rank = max(1.0, q * total)  # the smallest value whose cumulative weight reaches q of the total
            acc, found = 0, pairs[-1][0]
            for b, w in pairs:
                acc += w
                if acc >= rank - 1e-9:
                    found = b
                    break
            out.append(0.0 if found == self._ZERO_BIN else math.exp((found + 0.5) * self._LOG_RATIO))
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
