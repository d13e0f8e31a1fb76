"""The /v1/stats document: the recorder's windows joined with the engine snapshot and the policy.

Shape (times in ms, rates in tokens/s)::

    {"time": epoch_s, "window_s": 60, "uptime_s": ...,
     "classes": {name: {"kind", "priority", "background", "queued", "running", "depth_by_level",
                        "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "ttft_samples",
                        "itl_samples", "requests": {status: n}, "rejections": {reason: n},
                        "targets": {"ttft_ms", "itl_ms"},
                        "prefix_cache": {"token_hit_rate", "request_hit_rate", "hit_tokens", "prompt_tokens",
                                         "hit_requests", "requests"}}},
     "users": {name: {"tokens_per_s_10s", "tokens_per_s_60s", "prompt_tokens_per_s_60s",
                      "generated_tokens", "prompt_tokens", "fairness": {class: counter}}},
     "device": {model: {"kv_usage", "kv_blocks", "steps", "steps_per_s", "preemptions",
                        "last_batch_tokens", "last_batch_seqs"}},            (loaded LLMs)
     "models": {model: {"state", "loaded", "pinned", "load", "resident_bytes", "weights_bytes",
                        "kv_cache_bytes", "estimate_bytes", "load_s", "loaded_at", "num_loads", "requests",
                        "waiting_for_load", "keep_alive", "expires_at", "last_error"}},   (every LLM)
     "memory": {"budget_bytes", "held_bytes", "rss_mb", "rss_at_ready_mb"},
     "recent": [FinishedRequest dicts, most recent first]}
"""

from __future__ import annotations

from typing import Any

from homeai.metrics.prefix import prefix_entry
from homeai.metrics.recorder import MetricsRecorder
from homeai.policy.schema import Policy


def build_stats(recorder: MetricsRecorder, snapshot: dict[str, Any] | None, policy: Policy | None,
                recent_limit: int = 50) -> dict[str, Any]:
    """One JSON-ready snapshot for the TUI (cheap: called about twice a second per viewer)."""
    snap = snapshot or {}
    snap_classes: dict[str, dict[str, Any]] = snap.get("classes") or {}
    names = set(snap_classes) | recorder.class_names() | (set(policy.classes) if policy else set())
    classes: dict[str, dict[str, Any]] = {}
    fairness_by_user: dict[str, dict[str, float]] = {}
    raw_fairness: dict[str, dict[str, float]] = {}  # the scheduler's counters, by the user as it named them
    for name in sorted(names):
        engine = snap_classes.get(name, {})
        entry: dict[str, Any] = {
            "queued": int(engine.get("queued", 0)),
            "running": int(engine.get("running", 0)),
            "depth_by_level": engine.get("depth_by_level", {}),
            **recorder.class_latency(name),
            "requests": recorder.requests_by_status(name),
            "rejections": recorder.rejections(name),
            "prefix_cache": prefix_entry(snap, name),
        }
        cp = policy.classes.get(name) if policy else None
        if cp is not None:
            entry.update(kind=cp.kind, model=cp.model, priority=cp.priority, background=cp.background,
                         targets={"ttft_ms": cp.targets.ttft_ms, "itl_ms": cp.targets.itl_ms})
        classes[name] = entry
        for user, counter in (engine.get("fairness") or {}).items():
            raw_fairness.setdefault(str(user), {})[name] = float(counter)
    # Under the recorder's user rows (cut names, past the cap "(other)", counters summed): every raw name the
    # scheduler counted became a row of its own, without bound, beside the row of its rates.
    for user, row_name in recorder.stats_user_rows(raw_fairness).items():
        row = fairness_by_user.setdefault(row_name, {})
        for name, counter in raw_fairness[user].items():
            row[name] = row.get(name, 0.0) + counter
    users: dict[str, dict[str, Any]] = recorder.user_rates()  # rates, plus fairness counters below
    for user in fairness_by_user.keys() - users.keys():
        users[user] = {"tokens_per_s_10s": 0.0, "tokens_per_s_60s": 0.0, "prompt_tokens_per_s_60s": 0.0,
                       "generated_tokens": 0, "prompt_tokens": 0}
    for user, entry in users.items():
        entry["fairness"] = fairness_by_user.get(user, {})
    device: dict[str, dict[str, Any]] = {}
    for model, d in (snap.get("device") or {}).items():
        device[model] = {**d, "steps_per_s": recorder.steps_per_s(model, int(d.get("steps", 0)))}
    return {
        "time": recorder.wall_clock(),
        "uptime_s": recorder.clock() - recorder.started_s,
        "window_s": recorder.window_s,
        "num_live_requests": recorder.num_live(),
        "classes": classes,
        "users": dict(sorted(users.items())),
        "device": device,
        # every LLM the policy names, loaded or not, and what the loaded models hold of the memory budget
        "models": snap.get("models") or {},
        "memory": snap.get("memory") or {},
        "engine_health": snap.get("engine_health") or {"failing": False, "last_error": None, "errors": []},
        "recent": recorder.recent_requests(recent_limit),
    }
