"""A fallback policy in the TUI: the top line says so while the server runs a fallback policy because its
policy file was refused at start-up (``policy`` in /v1/stats), and stops saying so once it is over."""

from __future__ import annotations

import time

from textual.pilot import Pilot
from tui_helpers import ReplayClient, recorded_json

from tui.app import MonitorApp
from tui.documents import StatsDoc, convert
from tui.widgets import StatusLine

REFUSED = {"status": "fallback", "running": "stored policy version 3", "file": "/var/lib/homeai/policy.yaml",
           "reason": "policy file /var/lib/homeai/policy.yaml is invalid (...); running stored policy version 3",
           "errors": [{"path": "classes.voice.max_running", "message": "must be >= 1"}]}


async def until(pilot: Pilot[None], check: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


async def test_status_line_warns_while_the_policy_file_is_refused() -> None:
    last = recorded_json()[-1]
    docs = [convert({**last, "policy": REFUSED}, StatsDoc)]
    app = MonitorApp(ReplayClient(docs))
    async with app.run_test(size=(120, 24)) as pilot:
        line = app.screen.query_one(StatusLine)
        await until(pilot, lambda: app.stats is not None and "policy file refused" in str(line.render()))
        assert "stored policy version 3" in str(line.render())
        app.add_stats(convert({**last, "policy": {"status": "ok"}}, StatsDoc))
        await until(pilot, lambda: "refused" not in str(line.render()))
        assert "live" in str(line.render())
