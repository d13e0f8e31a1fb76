"""MetricsRecorder on virtual time: TTFT/ITL windows, per-user rates, Prometheus text, recent list."""

from __future__ import annotations

import pytest

from homeai.metrics.recorder import MAX_USER_LABELS, OTHER_USERS, USER_LABEL_CHARS, MetricsRecorder
from homeai.metrics.stats import build_stats
from homeai.metrics.windows import LatencyWindow, RateWindow
from homeai.policy.loader import load_policy


def lat(value: float) -> object:
    """Latency windows report values within their bin resolution (±1 %)."""
    return pytest.approx(value, rel=LatencyWindow.REL_ERROR * 1.01)


class VirtualClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt_s: float) -> None:
        self.t += dt_s


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def rec(clock: VirtualClock) -> MetricsRecorder:
    return MetricsRecorder(clock=clock, wall_clock=lambda: 1.7e9)


def run_request(rec: MetricsRecorder, clock: VirtualClock, rid: str, *, ttft_s: float, gaps_s: list[float],
                class_name: str = "chat", user: str = "alice", prompt: int = 10) -> None:
    rec.request_started(rid, "llm", class_name, user, "m", prompt)
    clock.advance(ttft_s)
    rec.first_token(rid)
    rec.tokens(rid, 1)
    for gap in gaps_s:
        clock.advance(gap)
        rec.tokens(rid, 1)
    rec.finished(rid, "ok", 1 + len(gaps_s))


def test_latency_window_percentiles_and_expiry() -> None:
    w = LatencyWindow(window_s=60.0)
    for i in range(100):
        w.add(float(i) * 0.1, (i + 1) / 1000.0)  # 1..100 ms
    p50, p99 = w.percentiles(10.0)
    assert p50 == lat(0.050) and p99 == lat(0.099)
    assert w.percentiles(100.0) == [None, None]  # everything older than 60 s is gone


def test_latency_window_zero_gaps() -> None:
    w = LatencyWindow()
    w.add(0.0, 0.0, weight=3)
    w.add(0.0, 0.2)
    assert w.percentiles(0.0) == [0.0, lat(0.2)]


def test_latency_window_weights_count_as_samples() -> None:
    w = LatencyWindow()
    w.add(0.0, 0.010, weight=9)
    w.add(0.0, 0.500, weight=1)
    assert w.percentiles(0.0) == [lat(0.010), lat(0.500)]
    assert w.count(0.0) == 10


def test_rate_window_spans() -> None:
    r = RateWindow(window_s=60.0)
    for second in range(60):
        r.add(float(second) + 0.05, 10)
    assert r.sum(59.5, 10.0) == 100
    assert r.rate(59.5, 10.0) == pytest.approx(10.0)
    assert r.rate(59.5, 60.0) == pytest.approx(10.0)
    assert r.total == 600 and r.is_idle(200.0)


def test_ttft_and_itl_percentiles_per_class(rec: MetricsRecorder, clock: VirtualClock) -> None:
    for i in range(10):
        run_request(rec, clock, f"v{i}", ttft_s=0.1 + i * 0.01, gaps_s=[0.02] * 5, class_name="voice")
    run_request(rec, clock, "c0", ttft_s=2.0, gaps_s=[0.2, 0.2], class_name="chat")
    voice = rec.class_latency("voice")
    assert voice["ttft_p50_ms"] == lat(140.0)
    assert voice["ttft_p99_ms"] == lat(190.0)
    assert voice["itl_p50_ms"] == lat(20.0) and voice["itl_p99_ms"] == lat(20.0)
    assert voice["itl_samples"] == 50  # the first delivery has no gap
    assert rec.class_latency("chat")["ttft_p50_ms"] == lat(2000.0)
    clock.advance(61.0)
    assert rec.class_latency("voice")["ttft_p50_ms"] is None


def test_multi_token_delta_splits_the_gap(rec: MetricsRecorder, clock: VirtualClock) -> None:
    rec.request_started("r", "llm", "chat", "bob", "m", 3)
    clock.advance(0.5)
    rec.tokens("r", 1)  # implies the first token
    clock.advance(0.4)
    rec.tokens("r", 4)  # four tokens at once: four gaps of 100 ms
    got = rec.class_latency("chat")
    assert got["ttft_p50_ms"] == lat(500.0)
    assert got["itl_p50_ms"] == lat(100.0) and got["itl_samples"] == 4
    text = rec.prometheus_text().decode()
    assert 'homeai_itl_seconds_count{class_name="chat"} 4.0' in text


def test_user_rates_over_10_and_60_seconds(rec: MetricsRecorder, clock: VirtualClock) -> None:
    clock.advance(100.0)  # the recorder has been up long enough for full windows
    rec.request_started("a", "llm", "chat", "alice", "m", 0)
    rec.request_started("b", "llm", "chat", "bob", "m", 0)
    rec.tokens("a", 1)
    rec.tokens("b", 1)
    for _ in range(60):  # alice 20 tok/s for 60 s; bob 5 tok/s for the last 10 s only
        clock.advance(1.0)
        rec.tokens("a", 20)
        if clock.t > 1150.0:
            rec.tokens("b", 5)
    rates = rec.user_rates()
    assert rates["alice"]["tokens_per_s_10s"] == pytest.approx(20.0)
    assert rates["alice"]["tokens_per_s_60s"] == pytest.approx(20.0, rel=0.02)
    assert rates["bob"]["tokens_per_s_10s"] == pytest.approx(5.0)
    assert rates["bob"]["tokens_per_s_60s"] == pytest.approx(50 / 60, rel=0.05)
    clock.advance(30.0)
    assert rec.user_rates()["alice"]["tokens_per_s_10s"] == 0.0


def test_finished_counts_missing_tokens_and_fills_recent(rec: MetricsRecorder, clock: VirtualClock) -> None:
    rec.request_started("e", "embedding", "embedding", "carol", "minilm", 12)
    clock.advance(0.03)
    rec.finished("e", "ok", 0)
    rec.request_started("g", "llm", "chat", "carol", "m", 5)
    clock.advance(1.0)
    rec.first_token("g")
    rec.finished("g", "aborted", 7)  # the app never called tokens(): counted at the end
    recent = rec.recent_requests()
    assert [r["request_id"] for r in recent] == ["g", "e"]
    assert recent[0]["num_output_tokens"] == 7 and recent[0]["status"] == "aborted"
    assert recent[0]["ttft_ms"] == pytest.approx(1000.0)
    assert recent[1]["ttft_ms"] is None and recent[1]["e2e_ms"] == pytest.approx(30.0)
    assert rec.user_rates()["carol"]["generated_tokens"] == 7
    assert rec.requests_by_status("chat") == {"aborted": 1}
    rec.tokens("unknown", 3)  # never started: ignored
    rec.finished("unknown", "ok", 3)


def test_placed_names_the_node_in_recent_the_last_placement_counts(rec: MetricsRecorder,
                                                                   clock: VirtualClock) -> None:
    rec.request_started("p", "llm", "chat", "dave", "m", 4)
    rec.placed("p", "node-a")
    rec.placed("p", "node-b")  # its first replica failed before a token: placed again
    rec.finished("p", "ok", 2)
    rec.request_started("s", "llm", "chat", "dave", "m", 4)  # a single box: never placed
    rec.finished("s", "ok", 2)
    rec.placed("unknown", "node-a")  # never started (or already finished): ignored
    rec.placed("p", "node-c")
    assert [(r["request_id"], r["node"]) for r in rec.recent_requests()] == [("s", None), ("p", "node-b")]
    assert rec.num_live() == 0


def test_recent_ring_is_bounded(clock: VirtualClock) -> None:
    rec = MetricsRecorder(clock=clock, max_recent=200)
    for i in range(250):
        rec.request_started(str(i), "llm", "chat", "u", "m", 1)
        rec.finished(str(i), "ok", 0)
    recent = rec.recent_requests()
    assert len(recent) == 200 and recent[0]["request_id"] == "249"


def test_prometheus_text_has_labelled_series(rec: MetricsRecorder, clock: VirtualClock) -> None:
    run_request(rec, clock, "a", ttft_s=0.2, gaps_s=[0.05], class_name="voice", user="kids", prompt=30)
    rec.rejected("chat", "queue_full")
    snapshot = {
        "classes": {"chat": {"queued": 3, "running": 2, "fairness": {"alice": 12.0}}},
        "device": {"smollm2": {"kv_usage": 0.25, "kv_blocks": 100, "steps": 42, "preemptions": 1,
                               "last_batch_tokens": 17, "last_batch_seqs": 5}},
    }
    text = rec.prometheus_text(snapshot).decode()
    for line in (
        'homeai_ttft_seconds_count{class_name="voice"} 1.0',
        'homeai_e2e_seconds_count{class_name="voice"} 1.0',
        'homeai_prompt_tokens_total{class_name="voice",user="kids"} 30.0',
        'homeai_generation_tokens_total{class_name="voice",user="kids"} 2.0',
        'homeai_requests_total{class_name="voice",status="ok"} 1.0',
        'homeai_requests_started_total{class_name="voice"} 1.0',
        'homeai_rejections_total{class_name="chat",reason="queue_full"} 1.0',
        'homeai_running{class_name="chat"} 2.0',
        'homeai_waiting{class_name="chat"} 3.0',
        'homeai_kv_cache_usage_ratio{model="smollm2"} 0.25',
        'homeai_preemptions_total{model="smollm2"} 1.0',
        'homeai_last_batch_seqs{model="smollm2"} 5.0',
    ):
        assert line in text, line
    assert "homeai_running{" not in rec.prometheus_text().decode()  # the snapshot is per scrape


def test_started_minus_finished_is_what_is_in_flight(rec: MetricsRecorder) -> None:
    rec.request_started("a", "chat", "chat", "u", "m", 1)
    rec.request_started("b", "chat", "chat", "u", "m", 1)
    rec.finished("a", "aborted", 0)
    text = rec.prometheus_text().decode()
    assert 'homeai_requests_started_total{class_name="chat"} 2.0' in text
    assert 'homeai_requests_total{class_name="chat",status="aborted"} 1.0' in text
    assert rec.num_live() == 1


def test_separate_registries() -> None:
    a, b = MetricsRecorder(), MetricsRecorder()
    a.rejected("chat", "queue_full")
    assert b"queue_full" not in b.prometheus_text()


def test_build_stats_joins_snapshot_and_policy(rec: MetricsRecorder, clock: VirtualClock) -> None:
    policy = load_policy("policies/default.yaml")
    run_request(rec, clock, "a", ttft_s=0.2, gaps_s=[0.05], class_name="voice", user="kids")
    rec.rejected("voice", "queue_full")
    snapshot = {"classes": {"voice": {"queued": 1, "running": 2, "fairness": {"kids": 7.5, "bob": 3.0}}},
                "device": {"m": {"kv_usage": 0.5, "steps": 10}}}
    stats = build_stats(rec, snapshot, policy)
    voice = stats["classes"]["voice"]
    assert voice["queued"] == 1 and voice["running"] == 2 and voice["ttft_p50_ms"] == lat(200.0)
    assert voice["rejections"] == {"queue_full": 1} and voice["targets"] == {"ttft_ms": 300, "itl_ms": 100}
    assert set(policy.classes) <= set(stats["classes"])
    assert stats["users"]["kids"]["fairness"] == {"voice": 7.5}
    assert stats["users"]["bob"]["tokens_per_s_10s"] == 0.0
    assert stats["device"]["m"]["steps_per_s"] == 0.0
    clock.advance(2.0)
    snapshot["device"]["m"]["steps"] = 30
    assert build_stats(rec, snapshot, policy)["device"]["m"]["steps_per_s"] == pytest.approx(10.0)
    assert stats["recent"][0]["class_name"] == "voice"


def test_user_labels_are_bounded_and_the_log_keeps_the_user(rec: MetricsRecorder, clock: VirtualClock) -> None:
    """Without keys a user is whatever a header or body says: one new name per request grew a Prometheus
    series pair and two rate windows each, for good. Past MAX_USER_LABELS they share one label, each cut
    to USER_LABEL_CHARS; the finished request (the request log) still names the user as given."""
    long = "x" * 2000
    for i in range(MAX_USER_LABELS + 40):
        run_request(rec, clock, f"r{i}", ttft_s=0.01, gaps_s=[0.01], user=f"u{i}-{long}")
    users = rec.user_rates()
    assert len(users) == MAX_USER_LABELS + 1 and OTHER_USERS in users
    assert max(len(u) for u in users) == USER_LABEL_CHARS
    assert users[OTHER_USERS]["generated_tokens"] == 2 * 40
    text = rec.prometheus_text().decode()
    assert text.count("homeai_generation_tokens_total{") == MAX_USER_LABELS + 1
    assert rec.recent[-1].user == f"u{MAX_USER_LABELS + 39}-{long}"


def test_a_label_idle_for_an_hour_goes_to_a_new_user_when_all_are_taken(rec: MetricsRecorder,
                                                                         clock: VirtualClock) -> None:
    """Found by a review: the first MAX_USER_LABELS names (a keyless client's per-conversation users) held
    the labels for good, and a household member given a key months later counted as "(other)"."""
    from homeai.metrics.recorder import LABEL_IDLE_S

    for i in range(MAX_USER_LABELS):
        run_request(rec, clock, f"r{i}", ttft_s=0.01, gaps_s=[0.01], user=f"conversation-{i}")
    run_request(rec, clock, "soon", ttft_s=0.01, gaps_s=[0.01], user="alice")
    assert "alice" not in rec.user_rates()  # every label was used within the hour
    clock.advance(LABEL_IDLE_S)
    run_request(rec, clock, "later", ttft_s=0.01, gaps_s=[0.01], user="alice")
    users = rec.user_rates()
    assert "alice" in users and "conversation-0" not in users and len(users) <= MAX_USER_LABELS + 1
    text = rec.prometheus_text().decode()
    assert 'user="alice"' in text and 'user="conversation-0"' not in text


def test_fairness_counters_land_on_the_users_rate_rows(rec: MetricsRecorder, clock: VirtualClock) -> None:
    """The scheduler counts every raw user name: each became a row of its own in /v1/stats (without bound,
    past the metrics' cap too) beside the row that held the user's rates under its cut name."""
    long = "x" * 2000
    users = [f"u{i}-{long}" for i in range(MAX_USER_LABELS + 40)]
    for i, user in enumerate(users):
        run_request(rec, clock, f"r{i}", ttft_s=0.01, gaps_s=[0.01], user=user)
    snapshot = {"classes": {"chat": {"queued": 0, "running": 0, "fairness": {u: 1.0 for u in users}}}, "device": {}}
    rows = build_stats(rec, snapshot, None)["users"]
    assert len(rows) == MAX_USER_LABELS + 1
    assert rows[OTHER_USERS]["fairness"] == {"chat": 40.0} and rows[OTHER_USERS]["generated_tokens"] == 80
    first = users[0][:USER_LABEL_CHARS]
    assert rows[first]["fairness"] == {"chat": 1.0} and rows[first]["generated_tokens"] == 2


def test_steps_per_s_starts_again_when_a_model_loads_again(rec: MetricsRecorder, clock: VirtualClock) -> None:
    """A model that leaves and loads again is a new engine counting from 0: the rate went negative."""
    rec.steps_per_s("m", 1000)
    clock.advance(1.0)
    rec.steps_per_s("m", 1100)
    clock.advance(60.0)
    assert rec.steps_per_s("m", 5) == 0.0
    clock.advance(5.0)
    assert rec.steps_per_s("m", 60) == pytest.approx(11.0)


def test_a_node_that_came_back_under_its_name_is_one_series(rec: MetricsRecorder) -> None:
    """Its entry that left stays listed beside the new one: two samples of one series, and Prometheus kept
    the first (the left one's up 0, free KV 0) while the node served."""
    def node(node_id: str, state: str, free: int) -> dict[str, object]:
        return {"name": "desktop", "node_id": node_id, "device": "cuda:0", "state": state, "running": {},
                "queued": {}, "free_kv_tokens": free, "served": 3, "failed": 0}

    text = rec.prometheus_text({"classes": {}, "device": {}, "cluster": {
        "nodes": [node("aaa", "left", 0), node("bbb", "ready", 9000)]}}).decode()
    up = [line for line in text.splitlines() if line.startswith("homeai_node_up{")]
    assert up == ['homeai_node_up{device="cuda:0",node="desktop"} 1.0']


def test_a_request_queued_for_hours_is_still_counted_when_it_ends(rec: MetricsRecorder, clock: VirtualClock) -> None:
    """A request live for more than an hour was dropped (its stats polled twice a second): a summary queued
    behind a night's indexing (background queues have no timeout) ended with no log row and no count."""
    rec.request_started("summary", "llm", "summarize", "indexer", "m", 1500)
    clock.advance(3 * 3600.0)
    assert rec.num_live() == 1
    rec.first_token("summary")
    rec.tokens("summary", 256)
    rec.finished("summary", "ok", 256)
    assert rec.recent_requests()[0]["request_id"] == "summary"
