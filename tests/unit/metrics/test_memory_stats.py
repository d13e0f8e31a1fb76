"""/v1/stats reports the server's resident memory now and once its models were loaded."""

from __future__ import annotations

from typing import Any

from homeai.api.observability_routes import stats_document
from homeai.api.services import Services
from homeai.api.settings import DEFAULT_POLICY, Settings
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder


class ReadyGateway:
    rss_at_ready_mb = 812.5

    def snapshot(self) -> dict[str, Any]:
        return {"classes": {}, "device": {}}


def test_stats_document_reports_rss() -> None:
    services = Services(Settings(), PolicyHolder(load_policy(DEFAULT_POLICY)), gateway=ReadyGateway())
    memory = stats_document(services)["memory"]
    assert memory["rss_at_ready_mb"] == 812.5 and memory["rss_mb"] > 10
    services.gateway = None
    assert stats_document(services)["memory"]["rss_at_ready_mb"] is None  # no gateway yet
