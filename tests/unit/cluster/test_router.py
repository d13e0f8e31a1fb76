"""The router places by class from published loads and its own placements: pure, no Ray."""

from __future__ import annotations

import pytest

from homeai.cluster.router import NoReplicaError, ReplicaLoad, Router, prompt_prefix

MODEL = "m"


def replica(rid: str, **kw: object) -> ReplicaLoad:
    return ReplicaLoad(rid, models=(MODEL,), base_s=0.01, row_s=0.002, prompt_token_s=0.002, **kw)  # type: ignore[arg-type]


def router() -> Router:
    return Router(["voice", "chat"])


def load(r: Router, rid: str, class_name: str, n: int, started: bool = True, prompt: int = 40) -> None:
    """``n`` requests of ``class_name`` placed on ``rid``: running (a first token seen) or waiting."""
    for _ in range(n):
        r.dispatched(rid, class_name, prompt, [])
        if started:
            r.first_token(rid, class_name, prompt)


def test_voice_goes_to_the_idle_replica_not_behind_background() -> None:
    r = router()
    load(r, "busy", "summarize", 1)
    busy, idle = replica("busy"), replica("idle")
    for order in ([busy, idle], [idle, busy]):
        assert r.place("voice", MODEL, 40, [], order).replica_id == "idle"


def test_published_counts_do_not_count_the_router_sees_every_request() -> None:
    """A load published before a request ended must not keep voice away: the router's own count is exact."""
    r = router()
    stale = replica("stale", running={"summarize": 12}, queued={"voice": 4})
    load(r, "other", "chat", 1)
    assert r.place("voice", MODEL, 40, [], [stale, replica("other")]).replica_id == "stale"


def test_voice_goes_where_less_interactive_work_waits() -> None:
    r = router()
    load(r, "a", "voice", 3, started=False)
    load(r, "b", "chat", 2)
    assert r.place("voice", MODEL, 40, [], [replica("a"), replica("b")]).replica_id == "b"


def test_a_burst_inside_one_publish_interval_is_spread_by_what_the_router_placed() -> None:
    """Loads are a second old: the router's own placements keep a burst of voice requests from piling up."""
    r = router()
    a, b = replica("a"), replica("b")
    placed = []
    for _ in range(6):
        rid = r.place("voice", MODEL, 40, [], [a, b]).replica_id
        r.dispatched(rid, "voice", 40, [])
        placed.append(rid)
    assert placed.count("a") == 3 and placed.count("b") == 3


def test_a_repeated_system_prompt_goes_back_to_the_replica_that_holds_its_blocks() -> None:
    r = router()
    a, b = replica("a"), replica("b")
    system = list(range(1, 321))  # a 320-token system prompt: 20 blocks
    prefix = prompt_prefix(MODEL, system + [7, 8, 9])
    first = r.place("voice", MODEL, 323, prefix, [a, b])
    r.dispatched(first.replica_id, "voice", 323, prefix)
    r.first_token(first.replica_id, "voice", 323)
    r.ended(first.replica_id, "voice", 323, had_first_token=True)
    again = prompt_prefix(MODEL, system + [4, 5, 6, 10])
    second = r.place("voice", MODEL, 324, again, [a, b])
    assert second.replica_id == first.replica_id and second.cached_blocks == 20
    # ... unless that replica is much busier: the first token comes sooner elsewhere
    load(r, first.replica_id, "voice", 6, started=False, prompt=300)
    load(r, first.replica_id, "chat", 30)
    other = b if first.replica_id == "a" else a
    assert r.place("voice", MODEL, 324, again, [a, b]).replica_id == other.replica_id


def test_background_goes_where_capacity_is_idle() -> None:
    r = router()
    load(r, "v", "voice", 2)
    load(r, "s", "summarize", 3)
    assert r.place("summarize", MODEL, 1500, [], [replica("v"), replica("s")]).replica_id == "s"
    assert r.place("summarize", MODEL, 1500, [], [replica("s"), replica("idle")]).replica_id == "idle"


def test_each_background_class_spreads_over_the_replicas() -> None:
    """Two replicas each running two background requests: a new summary goes where fewer summaries run."""
    r = router()
    load(r, "a", "summarize", 2)
    load(r, "b", "indexing", 1)
    load(r, "b", "summarize", 1)
    assert r.place("summarize", MODEL, 1500, [], [replica("a"), replica("b")]).replica_id == "b"
    assert r.place("indexing", MODEL, 200, [], [replica("a"), replica("b")]).replica_id == "a"


def test_a_replica_that_cannot_hold_the_prompt_is_the_last_resort() -> None:
    r = router()
    load(r, "loaded", "voice", 2, started=False)
    small = replica("small", free_kv_tokens=100)
    assert r.place("voice", MODEL, 800, [], [small, replica("loaded")]).replica_id == "loaded"


def test_only_live_ready_replicas_of_the_model_and_not_excluded() -> None:
    r = router()
    gone = replica("gone", alive=False)
    loading = replica("loading", ready=False)
    other_model = ReplicaLoad("x", models=("other",))
    ok = replica("ok")
    assert r.place("voice", MODEL, 10, [], [gone, loading, other_model, ok]).replica_id == "ok"
    with pytest.raises(NoReplicaError):
        r.place("voice", MODEL, 10, [], [gone, loading, other_model, ok], exclude={"ok"})


def test_forgetting_a_replica_drops_its_placements_and_prefixes() -> None:
    r = router()
    prefix = prompt_prefix(MODEL, list(range(64)))
    r.dispatched("a", "voice", 64, prefix)
    assert r.cached_blocks("a", prefix) == 4 and r.placed_live("a") == {"voice": 1}
    r.forget("a")
    assert r.cached_blocks("a", prefix) == 0 and r.placed_live("a") == {}


def test_bookkeeping_counts_waiting_until_the_first_token_and_live_until_the_end() -> None:
    r = router()
    a = replica("a")
    base = r.predict_ttft_s(a, 40)
    r.dispatched("a", "voice", 500, [])
    waiting = r.predict_ttft_s(a, 40)
    assert waiting > base + 0.9  # a 500-token prefill ahead at 2 ms a token
    r.first_token("a", "voice", 500)
    assert r.predict_ttft_s(a, 40) < waiting
    r.ended("a", "voice", 500, had_first_token=True)
    assert r.placed_live("a") == {"voice": 0}
    assert r.predict_ttft_s(a, 40) == pytest.approx(base)


def test_each_users_requests_spread_over_equally_good_replicas() -> None:
    """alice, bob, alice, bob ... at once: each replica gets both users (not one replica per user, which
    would give each user a whole replica whatever their weights)."""
    r = router()
    reps = [replica("a"), replica("b")]
    placed: dict[str, list[str]] = {"a": [], "b": []}
    for user in ["alice", "bob"] * 4:
        rid = r.place("chat", MODEL, 40, [], reps, user=user).replica_id
        r.dispatched(rid, "chat", 40, [], user)
        placed[rid].append(user)
    assert sorted(placed["a"]) == sorted(placed["b"]) == ["alice", "alice", "bob", "bob"]


def test_a_replica_that_serves_a_model_it_has_not_loaded_takes_requests_when_no_other_has_it() -> None:
    """Replicas published only their loaded models: one whose on-demand model had left by keep_alive never got
    a request for it again (all went to the front door, or a 503 with nothing else). It is a candidate now,
    after every replica that has the model on its device."""
    r = router()
    warm, cold = replica("warm", loaded=(MODEL,)), replica("cold", loaded=())
    load(r, "warm", "chat", 3)  # busier than the cold one, and still preferred: a load takes seconds
    assert r.place("chat", MODEL, 40, (), [warm, cold]).replica_id == "warm"
    assert r.place("chat", MODEL, 40, (), [cold]).replica_id == "cold"
    with pytest.raises(NoReplicaError):
        r.place("chat", "other", 40, (), [warm, cold])


def test_a_replica_of_several_models_is_judged_by_the_requested_models_cost_and_kv() -> None:
    """Found by a review: a replica serving a 135M voice model and an 8B chat model published one model's
    step cost (whichever came last) and the largest of their free KV pools, so voice was predicted at the
    8B's step and a chat prompt 'fit' in the small model's pool while the 8B's was full."""
    r = Router(["voice", "chat"])
    both = ReplicaLoad("both", models=("small", "big"), base_s=0.5, row_s=0.05, prompt_token_s=0.01,
                       free_kv_tokens=10_000,
                       per_model={"small": {"base_s": 0.01, "row_s": 0.001, "prompt_token_s": 0.0005,
                                            "free_kv_tokens": 10_000},
                                  "big": {"base_s": 0.5, "row_s": 0.05, "prompt_token_s": 0.01, "free_kv_tokens": 0}})
    small_only = ReplicaLoad("small-only", models=("small", "big"), base_s=0.05, row_s=0.005, prompt_token_s=0.002)
    assert r.place("voice", "small", 40, [], [both, small_only]).replica_id == "both"
    assert r.place("chat", "big", 400, [], [both, small_only]).replica_id == "small-only"  # its pool is full


def test_an_idle_node_without_the_model_loaded_beats_a_front_door_seconds_behind() -> None:
    """Found by a review: coldness ranked before the predicted first token, and the front door always has the
    model (it tokenizes every request), so traffic piled on it (26 s predicted) while a node idled whose only
    cost was a load. A load now counts as its seconds of waiting."""
    r = router()
    load(r, "front", "chat", 50, started=False)
    front, node = replica("front", loaded=(MODEL,)), replica("node", loaded=(), load_s={MODEL: 2.0})
    assert r.place("chat", MODEL, 40, (), [front, node]).replica_id == "node"
    assert r.place("summarize", MODEL, 40, (), [front, node]).replica_id == "node"
    quiet = router()  # the same front door, idle: a 2 s load is not worth it
    assert quiet.place("chat", MODEL, 40, (), [front, node]).replica_id == "front"


def test_a_replicas_user_counts_keep_only_live_users_and_a_forgotten_replica_stays_forgotten() -> None:
    """Found by a review: each user name stayed in a replica's counts at 0 for good, and a request placed on a
    replica as it left created its entry again after ``forget`` (with up to 8,192 prefix hashes)."""
    r = router()
    for i in range(100):
        r.dispatched("a", "chat", 40, [], user=f"conversation-{i}")
        r.ended("a", "chat", 40, True, user=f"conversation-{i}")
    assert r._placed["a"].users == {}
    r.forget("a")
    r.dispatched("a", "chat", 40, [1, 2, 3], user="late")  # type: ignore[list-item]
    r.ended("a", "chat", 40, False, user="late")
    assert "a" not in r._placed
    r.place("chat", MODEL, 40, [], [replica("a")])  # published again: counted again
    r.dispatched("a", "chat", 40, [], user="back")
    assert r._placed["a"].users == {"back": 1}
