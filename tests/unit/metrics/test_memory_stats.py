"""/v1/stats reports the server's resident memory now and once its models were loaded."""

from __future__ import annotations

from typing import Any

from litestar.datastructures import State

from homeai.api.observability_routes import stats_document


class ReadyGateway:
    rss_at_ready_mb = 812.5

    def snapshot(self) -> dict[str, Any]:
        return {"classes": {}, "device": {}}


def test_stats_document_reports_rss() -> None:
    memory = stats_document(State({"gateway": ReadyGateway()}))["memory"]
    assert memory["rss_at_ready_mb"] == 812.5 and memory["rss_mb"] > 10
    assert stats_document(State({}))["memory"]["rss_at_ready_mb"] is None  # no gateway yet
