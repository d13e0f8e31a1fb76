"""Text that comes from the server (user names, classes, models, who applied a policy) is drawn as it is,
never read as markup: a user named "[/x]" (any client may name itself so without keys) made the dashboard
and the requests screen raise MarkupError, and the app exited at every start until the server restarted."""

from __future__ import annotations

import copy
from typing import Any

from textual.widgets import DataTable, Static
from tui_helpers import ReplayClient, recorded_json

from tui.app import MonitorApp
from tui.documents import StatsDoc, convert

NAME = "[/x] [bold]bob"


def doc(users: dict[str, Any], recent: list[dict[str, Any]]) -> StatsDoc:
    raw = copy.deepcopy(recorded_json()[-1])
    raw["users"], raw["recent"] = users, recent
    return convert(raw, StatsDoc)


async def test_a_user_named_like_markup_is_drawn_as_it_is() -> None:
    recent = [{"request_id": "r1", "user": NAME, "class_name": "chat", "model": "m", "status": "ok",
               "finished_at": 1.0}]
    app = MonitorApp(ReplayClient([doc({NAME: {"tokens_per_s_10s": 1.0}}, recent)]))
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.pause()
        await pilot.pause()
        who = [str(w.render()) for w in app.screen.query(".who").results(Static)]
        assert NAME in who
        await pilot.press("r")
        await pilot.pause()
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert any(str(cell) == NAME for row in range(table.row_count) for cell in table.get_row_at(row))
        assert app.is_running


async def test_the_policy_editor_takes_no_typing_before_the_running_policy_is_in() -> None:
    """The editor was focused and empty while the policy loaded, and the load replaced what was typed."""
    import asyncio

    from textual.widgets import TextArea

    gate = asyncio.Event()

    class SlowPolicy(ReplayClient):
        async def get_policy(self) -> str:
            await gate.wait()
            return await super().get_policy()

    app = MonitorApp(SlowPolicy())
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("p")
        await pilot.pause()
        editor = app.screen.query_one("#editor", TextArea)
        assert editor.read_only
        gate.set()
        for _ in range(50):
            await pilot.pause()
            if not editor.read_only:
                break
        assert not editor.read_only and "classes:" in editor.text
