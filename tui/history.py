"""What one stats document cannot show: how the numbers moved. Feeds the charts and sparklines.

Samples are keyed by the document's own ``time`` (the server's clock), not the TUI's, so replaying
recorded documents draws the same charts every time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from tui.documents import StatsDoc

DEFAULT_SPAN_S = 300.0  # keep five minutes; the charts show the last three by default


class StatsHistory:
    """Per-class TTFT p50/p99 and per-person token rates over the last ``span_s`` seconds."""

    def __init__(self, span_s: float = DEFAULT_SPAN_S, max_samples: int = 2000) -> None:
        self.span_s = span_s
        self.max_samples = max_samples
        self.now_s = 0.0
        self.num_docs = 0
        self.ttft: dict[str, deque[tuple[float, float | None, float | None]]] = {}
        self.user_rate: dict[str, deque[tuple[float, float]]] = {}

    def add(self, doc: StatsDoc) -> None:
        """Record one /v1/stats document (called for every streamed event)."""
        t = doc.time
        self.now_s = max(self.now_s, t)
        self.num_docs += 1
        for name, entry in doc.classes.items():
            series = self.ttft.setdefault(name, deque(maxlen=self.max_samples))
            series.append((t, entry.ttft_p50_ms, entry.ttft_p99_ms))
        for user, rate in doc.users.items():
            rates = self.user_rate.setdefault(user, deque(maxlen=self.max_samples))
            rates.append((t, rate.tokens_per_s_10s))
        # every series ages, not only those in this document: a person the server no longer reports (after a
        # restart) kept their old peak, which set the scale of everyone's sparkline
        for series_of in (self.ttft, self.user_rate):
            for key in list(series_of):
                _trim(series_of[key], self.now_s - self.span_s)
                if not series_of[key]:
                    del series_of[key]

    def ttft_buckets(self, class_name: str, num_buckets: int, span_s: float = 180.0,
                     which: int = 2) -> list[float | None]:
        """TTFT over the last ``span_s`` in ``num_buckets`` columns, oldest first: the worst (max) p99
        (``which=2``) or p50 (``which=1``) sampled in each column; None where nothing was measured."""
        return self._buckets(self.ttft.get(class_name, ()), which, num_buckets, span_s)

    def rate_buckets(self, user: str, num_buckets: int, span_s: float = 120.0) -> list[float]:
        """The person's 10-second token rate over the last ``span_s`` (the peak in each column; 0 if idle)."""
        return [v or 0.0 for v in self._buckets(self.user_rate.get(user, ()), 1, num_buckets, span_s)]

    def peak_rate(self) -> float:
        """The highest rate anyone had in the history: one scale for every person's sparkline."""
        return max((r for series in self.user_rate.values() for _, r in series), default=0.0)

    def _buckets(self, samples: Iterable[tuple[Any, ...]], index: int, num_buckets: int,
                 span_s: float) -> list[float | None]:
        out: list[float | None] = [None] * max(num_buckets, 0)
        start = self.now_s - span_s
        for sample in samples:
            value = sample[index]
            if value is None or sample[0] <= start or not out:
                continue
            i = min(num_buckets - 1, int((sample[0] - start) / span_s * num_buckets))
            prev = out[i]
            out[i] = value if prev is None else max(prev, value)
        return out


def _trim(series: deque[Any], oldest_s: float) -> None:
    while series and series[0][0] < oldest_s:
        series.popleft()

