"""The dashboard's hit column: prefix-cache hit rate of a class in tokens/requests, '–' before any."""

from __future__ import annotations

from typing import Any

from tui.documents import ClassStats, convert
from tui.screens.dashboard import class_cells


def cells(entry: dict[str, Any]) -> dict[str, Any]:
    return class_cells(convert(entry, ClassStats))


def test_hit_column_shows_token_and_request_rates() -> None:
    entry = {"kind": "llm", "prefix_cache": {"token_hit_rate": 0.934, "request_hit_rate": 0.5, "requests": 4}}
    assert cells(entry)["hit"].plain == "93/50"
    assert cells({"kind": "llm", "prefix_cache": {"requests": 0}})["hit"].plain == "–"
    assert cells({"kind": "embedding", "prefix_cache": {"requests": 3}})["hit"].plain == "–"
