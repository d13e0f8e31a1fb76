"""The dashboard's device section with several LLMs: a loaded model's line says what it holds and how long
it stays once idle; a model the policy names that is not on the device says so (and who waits for it)."""

from __future__ import annotations

import msgspec

from tui.documents import StatsDoc
from tui.screens.dashboard import device_line, residency_line, with_residency

DOC = {"device": {"voice-1b": {"kv_usage": 0.5, "steps": 3}},
       "models": {"voice-1b": {"state": "loaded", "pinned": True, "resident_bytes": 300 * 2**20},
                  "chat-8b": {"state": "loading", "loaded": False, "load": "on_demand", "waiting_for_load": 2,
                              "keep_alive": "5m"},
                  "code-7b": {"state": "unloaded", "loaded": False, "load": "on_demand", "keep_alive": "5m"}}}


def test_models_on_the_device_and_off_it() -> None:
    doc = msgspec.convert(DOC, StatsDoc)
    loaded = with_residency(device_line("voice-1b", doc.device["voice-1b"]), doc.models["voice-1b"]).plain
    assert "300 MB" in loaded and "pinned" in loaded
    assert "loading · 2 waiting" in residency_line("chat-8b", doc.models["chat-8b"]).plain
    assert "unloaded · loads on demand" in residency_line("code-7b", doc.models["code-7b"]).plain
    assert msgspec.convert({"device": {}}, StatsDoc).models == {}  # an older server says nothing of them
