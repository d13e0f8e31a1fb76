"""Snapshots (pytest-textual-snapshot) at 80x24, fed from recorded server answers (tui_helpers.ReplayClient).

Regenerate after an intended change with ``pytest tests/tui/test_tui_snapshots.py --snapshot-update`` and
look at the SVGs under ``__snapshots__`` before committing them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList, TextArea
from tui_helpers import ReplayClient

from tui.app import MonitorApp

SIZE = (80, 24)
Snap = Callable[..., bool]


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wall-clock times render in UTC, whatever this machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


async def until(pilot: Pilot[Any], check: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)
    await pilot.pause()


def replayed_app() -> tuple[MonitorApp, ReplayClient]:
    client = ReplayClient()
    return MonitorApp(client), client


def all_replayed(app: MonitorApp, client: ReplayClient) -> Callable[[Pilot[Any]], Any]:
    async def run_before(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.history.num_docs == len(client.docs))
        await pilot.pause(0.2)
    return run_before


def test_dashboard(snap_compare: Snap) -> None:
    app, client = replayed_app()
    assert snap_compare(app, terminal_size=SIZE, run_before=all_replayed(app, client))


def test_requests(snap_compare: Snap) -> None:
    app, client = replayed_app()
    replayed = all_replayed(app, client)

    async def run_before(pilot: Pilot[Any]) -> None:
        await replayed(pilot)
        await pilot.press("r")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


async def open_editor(pilot: Pilot[Any], client: ReplayClient) -> TextArea:
    await pilot.press("p")
    editor = pilot.app.screen.query_one("#editor", TextArea)
    editor.cursor_blink = False
    await until(pilot, lambda: editor.text == client.policy_text)
    return editor


def test_policy_editor(snap_compare: Snap) -> None:
    app, client = replayed_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await all_replayed(app, client)(pilot)
        await open_editor(pilot, client)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_policy_editor_errors_at_key_paths(snap_compare: Snap) -> None:
    """The recorded 422 for three mistakes: each listed with its line, the cursor on the first."""
    app, client = replayed_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await all_replayed(app, client)(pilot)
        editor = await open_editor(pilot, client)
        editor.load_text(client.invalid_text)
        await pilot.press("ctrl+s")
        findings = pilot.app.screen.query_one("#findings", OptionList)
        await until(pilot, lambda: findings.option_count == 3)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
