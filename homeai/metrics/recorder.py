"""Per-request timings and what they add up to: Prometheus series, sliding windows, recent requests.

The API calls the recorder from the event loop as a request progresses::

    request_started -> [queued] [placed] -> first_token -> tokens ... tokens -> finished
    rejected (a request refused before it ever ran, e.g. a full queue)

Every call is a few dict lookups and deque appends (no I/O, no lock held beyond prometheus_client's
per-series one), so it is safe per token delta. Times come from an injectable monotonic ``clock`` so
that tests run on virtual time; ``wall_clock`` only stamps the recent-requests list.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import generate_latest

from homeai.metrics.prometheus import PromSeries
from homeai.metrics.windows import LatencyWindow, RateWindow

Clock = Callable[[], float]
STATUSES = ("ok", "error", "aborted", "rejected", "timeout")
# A request never finished after this long is dropped (a caller bug, not a hang to keep). A week: background
# queues have no timeout, and a summary queued behind a night's indexing waited past the hour this was,
# then vanished from the metrics and the request log when it did finish.
_STALE_S = 7 * 86400.0
# Users get a Prometheus label (and a token-rate window) of their own up to this many, each name cut to
# USER_LABEL_CHARS; later ones share OTHER_USERS. Without keys a user is whatever X-HomeAI-User or the body's
# ``user`` says: a client naming a new one on every request grew /metrics and memory without bound.
MAX_USER_LABELS = 128
USER_LABEL_CHARS = 64
OTHER_USERS = "(other)"
# A label whose user sent nothing for this long (and has nothing live) is handed to a new user when all are
# taken: the first 128 names (a keyless client's per-conversation users) held them for good, and everyone
# after, a household member given a key months later included, counted as OTHER_USERS until a restart.
LABEL_IDLE_S = 3600.0


@dataclass(slots=True)
class _Live:
    kind: str
    class_name: str
    user: str
    model: str
    num_prompt_tokens: int
    started_s: float
    itl_hist: Any  # resolved once per request: tokens() runs per delta
    gen_counter: Any
    itl_window: LatencyWindow
    user_rate: RateWindow
    first_token_s: float | None = None
    last_token_s: float | None = None
    queue_s: float | None = None  # its wait in the class queue, once reported
    num_output_tokens: int = 0  # counted through tokens()
    node: str | None = None  # the cluster node that served it (the last placement); None on a single box


@dataclass(slots=True)
class FinishedRequest:
    """One line of the TUI's request list."""

    request_id: str
    kind: str
    class_name: str
    user: str
    model: str
    num_prompt_tokens: int
    num_output_tokens: int
    ttft_ms: float | None
    e2e_ms: float
    status: str
    finished_at: float  # wall clock (epoch seconds)
    queue_ms: float | None = None  # its wait in the class queue (LLM requests the engine admitted)
    itl_ms: float | None = None  # mean gap between output tokens (None below two deliveries)
    node: str | None = None  # the cluster node that served it; None on a single box

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MetricsRecorder:
    """Records request timings; serves Prometheus text and the windows behind /v1/stats."""

    def __init__(self, clock: Clock = time.monotonic, wall_clock: Clock = time.time,
                 window_s: float = 60.0, max_recent: int = 200) -> None:
        self.clock = clock
        self.wall_clock = wall_clock
        self.window_s = window_s
        self.series = PromSeries()
        self.started_s = clock()
        self.recent: deque[FinishedRequest] = deque(maxlen=max_recent)
        self._live: dict[str, _Live] = {}
        self._ttft: dict[str, LatencyWindow] = {}
        self._itl: dict[str, LatencyWindow] = {}
        self._user_gen: dict[str, RateWindow] = {}
        self._user_prompt: dict[str, RateWindow] = {}
        self._user_labels: set[str] = set()
        self._label_used_s: dict[str, float] = {}  # label -> when a request of it last started
        self._requests: dict[str, dict[str, int]] = {}    # class -> status -> count
        self._rejections: dict[str, dict[str, int]] = {}  # class -> reason -> count
        self._steps: dict[str, deque[tuple[float, int]]] = {}  # model -> (t, steps) at recent reads
        # Called with every FinishedRequest (the request log's writer); must not block or raise.
        self.listeners: list[Callable[[FinishedRequest], None]] = []

    # ---- the request path (event loop, per request / per delta) ----------------------------------
    def request_started(self, request_id: str, kind: str, class_name: str, user: str, model: str,
                        num_prompt_tokens: int) -> None:
        now = self.clock()
        series = self.series
        label = self._user_label(user)  # the request log keeps the user as given
        self._live[request_id] = _Live(
            kind, class_name, user, model, num_prompt_tokens, now,
            series.child(series.itl, class_name), series.child(series.generation_tokens, label, class_name),
            self._window(self._itl, class_name, self._new_latency), self._window(self._user_gen, label, RateWindow))
        series.child(series.started, class_name).inc()
        if num_prompt_tokens > 0:
            self.series.child(self.series.prompt_tokens, label, class_name).inc(num_prompt_tokens)
            self._window(self._user_prompt, label, RateWindow).add(now, num_prompt_tokens)

    def _user_label(self, user: str) -> str:
        """The name ``user`` is counted under in the metrics and the per-user rates (see MAX_USER_LABELS);
        when every label is taken, one idle for LABEL_IDLE_S is handed over first."""
        label = user[:USER_LABEL_CHARS]
        if label not in self._user_labels and len(self._user_labels) >= MAX_USER_LABELS:
            self._free_an_idle_label()
        label = _claim_label(self._user_labels, user)
        self._label_used_s[label] = self.clock()
        return label

    def _free_an_idle_label(self) -> None:
        now = self.clock()
        live = {live.user[:USER_LABEL_CHARS] for live in self._live.values()}
        idle = [(t, lab) for lab, t in self._label_used_s.items()
                if lab in self._user_labels and lab not in live and now - t >= LABEL_IDLE_S]
        if not idle:
            return
        _, label = min(idle)
        self._user_labels.discard(label)
        self._label_used_s.pop(label, None)
        self._user_gen.pop(label, None)
        self._user_prompt.pop(label, None)
        self.series.remove_user(label)

    def stats_user_rows(self, users: Iterable[str]) -> dict[str, str]:
        """The /v1/stats row each of ``users`` is shown under (the scheduler's fairness counters name every
        user): the row of its rates where it has one, else a row of its own while the rows stay within
        MAX_USER_LABELS, else OTHER_USERS. Adds no metrics label."""
        rows = set(self._user_labels)
        return {user: _claim_label(rows, user) for user in users}

    def queued(self, request_id: str, seconds: float) -> None:
        """The request left its class queue after ``seconds`` there (the engine's clock; observes
        homeai_queue_seconds, and the request log's queue_ms)."""
        live = self._live.get(request_id)
        if live is not None and live.queue_s is None:
            live.queue_s = seconds
            self.series.child(self.series.queue, live.class_name).observe(seconds)

    def placed(self, request_id: str, node: str) -> None:
        """The request is served by cluster node ``node``; a later placement (a retry) replaces it."""
        live = self._live.get(request_id)
        if live is not None:
            live.node = node

    def first_token(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is None or live.first_token_s is not None:
            return
        now = self.clock()
        live.first_token_s = now
        ttft_s = now - live.started_s
        self.series.child(self.series.ttft, live.class_name).observe(ttft_s)
        self._window(self._ttft, live.class_name, self._new_latency).add(now, ttft_s)

    def tokens(self, request_id: str, n: int) -> None:
        """``n`` output tokens reached the client now. The first delivery has no gap; later ones
        split the gap since the previous delivery evenly over their ``n`` tokens (one ITL each)."""
        live = self._live.get(request_id)
        if live is None or n <= 0:
            return
        if live.first_token_s is None:
            self.first_token(request_id)
        now = self.clock()
        if live.last_token_s is not None:
            gap_s = (now - live.last_token_s) / n
            for _ in range(min(n, 64)):  # a huge delta is rare; cap the loop, the window keeps the weight
                live.itl_hist.observe(gap_s)
            live.itl_window.add(now, gap_s, n)
        live.last_token_s = now
        live.num_output_tokens += n
        live.gen_counter.inc(n)
        live.user_rate.add(now, n)

    def finished(self, request_id: str, status: str, num_output_tokens: int) -> None:
        """The request is over (``status`` in STATUSES); output tokens not yet counted are added."""
        live = self._live.pop(request_id, None)
        if live is None:
            return
        now = self.clock()
        missing = num_output_tokens - live.num_output_tokens
        if missing > 0:
            live.gen_counter.inc(missing)
            live.user_rate.add(now, missing)
        e2e_s = now - live.started_s
        self.series.child(self.series.e2e, live.class_name).observe(e2e_s)
        self.series.child(self.series.requests, live.class_name, status).inc()
        by_status = self._requests.setdefault(live.class_name, {})
        by_status[status] = by_status.get(status, 0) + 1
        ttft_ms = None if live.first_token_s is None else (live.first_token_s - live.started_s) * 1e3
        done = FinishedRequest(
            request_id, live.kind, live.class_name, live.user, live.model, live.num_prompt_tokens,
            max(num_output_tokens, live.num_output_tokens), ttft_ms, e2e_s * 1e3, status, self.wall_clock(),
            None if live.queue_s is None else live.queue_s * 1e3, _mean_itl_ms(live),
            live.node)
        self.recent.append(done)
        for listener in self.listeners:
            listener(done)

    def rejected(self, class_name: str, reason: str) -> None:
        """A request of ``class_name`` was refused (``reason``: queue_full, timeout, too_long, ...)."""
        self.series.child(self.series.rejections, class_name, reason).inc()
        by_reason = self._rejections.setdefault(class_name, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1

    def _new_latency(self) -> LatencyWindow:
        return LatencyWindow(self.window_s)

    @staticmethod
    def _window(table: dict[str, Any], key: str, factory: Callable[[], Any]) -> Any:
        found = table.get(key)
        if found is None:
            found = table[key] = factory()
        return found

    # ---- reads (scrape and stats time) -----------------------------------------------------------
    def prometheus_text(self, snapshot: dict[str, Any] | None = None) -> bytes:
        """The exposition text; ``snapshot`` (Gateway.snapshot()) fills the engine gauges."""
        self.series.collector.snapshot = snapshot
        try:
            return generate_latest(self.series.registry)
        finally:
            self.series.collector.snapshot = None

    def class_latency(self, class_name: str) -> dict[str, float | None]:
        """TTFT and ITL p50/p99 (ms) over the window, and how many samples they come from."""
        now = self.clock()
        out: dict[str, float | None] = {}
        for key, table in (("ttft", self._ttft), ("itl", self._itl)):
            window = table.get(class_name)
            p50, p99 = window.percentiles(now) if window is not None else (None, None)
            out[f"{key}_p50_ms"] = None if p50 is None else p50 * 1e3
            out[f"{key}_p99_ms"] = None if p99 is None else p99 * 1e3
            out[f"{key}_samples"] = window.count(now) if window is not None else 0
        return out

    def class_names(self) -> set[str]:
        """Classes that have been seen by the recorder (requests or rejections)."""
        return {*self._ttft, *self._itl, *self._requests, *self._rejections,
                *(live.class_name for live in self._live.values())}

    def requests_by_status(self, class_name: str) -> dict[str, int]:
        return dict(self._requests.get(class_name, {}))

    def rejections(self, class_name: str) -> dict[str, int]:
        return dict(self._rejections.get(class_name, {}))

    def user_rates(self) -> dict[str, dict[str, float]]:
        """Per user: generated tokens/s over 10 s and 60 s, prompt tokens/s over 60 s, totals."""
        now = self.clock()
        active_s = now - self.started_s
        out: dict[str, dict[str, float]] = {}
        for user in sorted({*self._user_gen, *self._user_prompt}):
            gen, prompt = self._user_gen.get(user), self._user_prompt.get(user)
            out[user] = {
                "tokens_per_s_10s": gen.rate(now, 10.0, active_s) if gen else 0.0,
                "tokens_per_s_60s": gen.rate(now, 60.0, active_s) if gen else 0.0,
                "prompt_tokens_per_s_60s": prompt.rate(now, 60.0, active_s) if prompt else 0.0,
                "generated_tokens": gen.total if gen else 0,
                "prompt_tokens": prompt.total if prompt else 0,
            }
        return out

    def steps_per_s(self, model: str, steps: int, span_s: float = 10.0) -> float:
        """Engine steps/s from successive snapshot reads (the first read gives 0)."""
        now = self.clock()
        history = self._steps.setdefault(model, deque(maxlen=256))
        if history and steps < history[-1][1]:  # a new engine (the model left and loaded again): from 0
            history.clear()
        history.append((now, steps))
        while len(history) > 2 and history[1][0] <= now - span_s:
            history.popleft()
        t0, s0 = history[0]
        return (steps - s0) / (now - t0) if now > t0 else 0.0

    def recent_requests(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Most recent first."""
        items = list(self.recent)[::-1]
        return [r.to_dict() for r in (items[:limit] if limit else items)]

    def num_live(self) -> int:
        self._drop_stale()
        return len(self._live)

    def _drop_stale(self) -> None:
        horizon = self.clock() - _STALE_S
        for rid in [rid for rid, live in self._live.items() if live.started_s < horizon]:
            del self._live[rid]


def _mean_itl_ms(live: _Live) -> float | None:
    """Mean inter-token gap: the time from the first to the last delivery over the tokens after the first."""
    if live.first_token_s is None or live.last_token_s is None or live.num_output_tokens < 2:
        return None
    return (live.last_token_s - live.first_token_s) / (live.num_output_tokens - 1) * 1e3


def _claim_label(labels: set[str], user: str) -> str:
    """``user``'s label in ``labels`` (cut to USER_LABEL_CHARS), added while there is room; OTHER_USERS
    once MAX_USER_LABELS are taken."""
    label = user[:USER_LABEL_CHARS]
    if label in labels:
        return label
    if len(labels) >= MAX_USER_LABELS:
        return OTHER_USERS
    labels.add(label)
    return label
