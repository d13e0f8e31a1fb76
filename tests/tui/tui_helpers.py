"""Test helpers: a stand-in GatewayClient replaying recorded server answers (deterministic snapshots).
The Pilot tests' real server comes from the shared launcher (tests/server_launcher.py).

The stats documents in ``fixtures/stats.json`` were recorded from a real server under a household load
(``fixtures/record_stats.py``); the 422 body in ``fixtures/policy_422.json`` is a real server's answer to
``fixtures/policy_invalid.yaml`` (each error with its path, message and line).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tui.client import ApiError, Connection, GatewayClient
from tui.documents import JobView, PolicyApplied, PolicyCheck, PolicyErrorItem, PolicyHistory, StatsDoc, convert

FIXTURES = Path(__file__).with_name("fixtures")


def recorded_json() -> list[dict[str, Any]]:
    """The recorded documents as the server sent them (JSON)."""
    return json.loads((FIXTURES / "stats.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def recorded_stats() -> list[StatsDoc]:
    return [convert(doc, StatsDoc) for doc in recorded_json()]


def recorded_422() -> ApiError:
    body = json.loads((FIXTURES / "policy_422.json").read_text(encoding="utf-8"))["error"]
    return ApiError(422, body["message"], convert(body["errors"], list[PolicyErrorItem]))


class ReplayClient(GatewayClient):
    """Streams the recorded documents once (then stays connected, silent); answers the policy calls
    from fixtures. ``put_policy`` and ``validate_policy`` answer the recorded 422 for the recorded
    invalid text."""

    def __init__(self, docs: list[StatsDoc] | None = None) -> None:
        super().__init__("http://homeai.local:8000")
        self.docs = recorded_stats() if docs is None else docs
        self.policy_text = (FIXTURES / "policy.yaml").read_text(encoding="utf-8")
        self.invalid_text = (FIXTURES / "policy_invalid.yaml").read_text(encoding="utf-8")
        self.put_texts: list[str] = []

    async def stats_events(self) -> AsyncIterator[StatsDoc | Connection]:
        yield Connection(True, "live")
        for doc in self.docs:
            yield doc
        await asyncio.Event().wait()  # a quiet but open stream

    async def get_policy(self) -> str:
        return self.policy_text

    async def validate_policy(self, text: str) -> PolicyCheck | None:
        if text == self.invalid_text:
            raise recorded_422()
        return PolicyCheck(valid=True, changed=text != self.policy_text)

    async def put_policy(self, text: str) -> PolicyApplied:
        self.put_texts.append(text)
        if text == self.invalid_text:
            raise recorded_422()
        return PolicyApplied(changed=text != self.policy_text, version=2)

    async def policy_history(self, limit: int = 50) -> PolicyHistory:
        return convert({"current": 1, "versions": [{"version": 1, "applied_at": "2026-01-01T08:00:00+00:00",
                                                    "applied_by": "startup", "note": "running policy"}]},
                       PolicyHistory)

    async def list_jobs(self) -> list[JobView]:
        return []
