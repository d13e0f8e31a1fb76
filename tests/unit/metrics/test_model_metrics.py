"""/v1/stats and /metrics by model: every LLM the policy names (loaded or not), what it holds, its loads,
and the memory budget the loaded models share, from the gateway's snapshot."""

from __future__ import annotations

from typing import Any

from homeai.api.observability_routes import stats_document
from homeai.api.services import Services
from homeai.api.settings import DEFAULT_POLICY, Settings
from homeai.metrics.recorder import MetricsRecorder
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder

MB = 2**20
SNAPSHOT: dict[str, Any] = {
    "classes": {}, "device": {"voice-model": {"kv_usage": 0.25, "kv_blocks": 64, "steps": 12}},
    "models": {"voice-model": {"state": "loaded", "loaded": True, "resident_bytes": 120 * MB, "load_s": 1.5,
                               "num_loads": 1, "waiting_for_load": 0, "expires_at": None},
               "chat-model": {"state": "unloaded", "loaded": False, "resident_bytes": 0, "load_s": 2.5,
                              "num_loads": 2, "waiting_for_load": 3, "expires_at": None}},
    "memory": {"budget_bytes": 1000 * MB, "held_bytes": 210 * MB},
}


class Gateway:
    rss_at_ready_mb = 500.0

    def snapshot(self) -> dict[str, Any]:
        return SNAPSHOT


def test_stats_by_model_and_the_memory_budget() -> None:
    doc = stats_document(Services(Settings(), PolicyHolder(load_policy(DEFAULT_POLICY)), gateway=Gateway()))
    assert doc["models"]["chat-model"]["num_loads"] == 2 and not doc["models"]["chat-model"]["loaded"]
    assert doc["device"]["voice-model"]["kv_usage"] == 0.25
    memory = doc["memory"]
    assert memory["budget_bytes"] == 1000 * MB and memory["held_bytes"] == 210 * MB
    assert memory["rss_at_ready_mb"] == 500.0 and memory["rss_mb"] > 10


def test_prometheus_series_by_model() -> None:
    text = MetricsRecorder().prometheus_text(SNAPSHOT).decode()
    assert 'homeai_model_loaded{model="voice-model"} 1.0' in text
    assert 'homeai_model_loaded{model="chat-model"} 0.0' in text
    assert 'homeai_model_resident_bytes{model="voice-model"} 1.2582912e+08' in text
    assert 'homeai_model_load_seconds{model="chat-model"} 2.5' in text
    assert 'homeai_model_loads_total{model="chat-model"} 2.0' in text
    assert 'homeai_model_waiting_for_load{model="chat-model"} 3.0' in text
    assert "homeai_memory_budget_bytes 1.048576e+09" in text
    assert 'homeai_kv_cache_usage_ratio{model="voice-model"} 0.25' in text
    assert 'homeai_engine_steps_total{model="voice-model"} 12.0' in text
