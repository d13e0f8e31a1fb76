"""The dashboard's nodes table (issue 23): absent on a single box; with a cluster, one row per node with its
device, models, state, load, free KV and outcomes; a node that left stays listed, dimmed, with how long ago.

Documents are fed one at a time through a stand-in client (the recorded single-box stats plus a ``cluster``
section shaped as the server's /v1/stats sends it), and the assertions read the drawn table.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from textual.pilot import Pilot
from tui_helpers import ReplayClient, recorded_json

from tui.app import MonitorApp
from tui.client import Connection
from tui.documents import StatsDoc, convert
from tui.nodes import NodesTable, fmt_tokens

SIZE = (80, 24)
BASE = recorded_json()[-1]
NOW = BASE["time"]


def node(name: str, **fields: Any) -> dict[str, Any]:
    entry = {"name": name, "node_id": f"id-{name}", "address": "192.168.1.20", "device": "cpu",
             "models": ["smollm2-135m-instruct"], "state": "ready", "replica": f"replica-{name}",
             "running": {}, "queued": {}, "free_kv_tokens": 0, "served": 0, "failed": 0, "since_s": NOW - 600}
    entry.update(fields)
    return entry


def doc_with(nodes: list[dict[str, Any]] | None) -> StatsDoc:
    raw = copy.deepcopy(BASE)
    if nodes is not None:
        raw["cluster"] = {"nodes": nodes}
    return convert(raw, StatsDoc)


LOCAL = node("local", device="cuda:0", address="192.168.1.10", running={"voice": 1, "chat": 2},
             queued={"chat": 3}, free_kv_tokens=48_640, served=120, failed=0)
DEN = node("den-pc", device="cuda:1", models=["smollm2-135m-instruct", "qwen2.5-7b-instruct"],
           running={"summaries": 4}, queued={}, free_kv_tokens=900, served=37, failed=2)
DEN_LEFT = {**DEN, "state": "left", "since_s": NOW - 65, "running": {}, "free_kv_tokens": 0}


class FeedClient(ReplayClient):
    """Streams whatever the test puts in ``feed``, one document at a time."""

    def __init__(self) -> None:
        super().__init__(docs=[])
        self.feed: asyncio.Queue[StatsDoc] = asyncio.Queue()

    async def stats_events(self) -> AsyncIterator[StatsDoc | Connection]:
        yield Connection(True, "live")
        while True:
            yield await self.feed.get()


async def until(pilot: Pilot[Any], check: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)
    await pilot.pause()


async def show(pilot: Pilot[Any], client: FeedClient, doc: StatsDoc) -> None:
    """Feed ``doc`` and wait until the app has drawn it."""
    app = pilot.app
    assert isinstance(app, MonitorApp)
    seen = app.history.num_docs
    await client.feed.put(doc)
    await until(pilot, lambda: app.history.num_docs > seen)


def rows(table: NodesTable) -> dict[str, list[str]]:
    """The drawn rows as text, by node key."""
    return {str(key.value): [str(c) for c in table.get_row(key)] for key in table.rows}


def styles(table: NodesTable, key: str) -> list[str]:
    return [str(cell.style) for cell in table.get_row(key)]


async def test_nodes_table_follows_the_cluster() -> None:
    client = FeedClient()
    app = MonitorApp(client)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#nodes", NodesTable)

        await show(pilot, client, doc_with(None))  # a single box: no table
        assert not table.display and table.row_count == 0

        await show(pilot, client, doc_with([DEN, LOCAL]))
        assert table.display
        assert list(rows(table)) == ["id-local", "id-den-pc"]  # the front door's own device first
        assert rows(table)["id-local"] == ["local", "cuda:0", "smollm2-135m-…", "ready", "3/3", "48.6k",
                                           "120/0"]
        assert rows(table)["id-den-pc"] == ["den-pc", "cuda:1", "smollm2-13… +1", "ready", "4/0", "900",
                                            "37/2"]
        assert "dim" not in styles(table, "id-den-pc")[0]
        assert table.border_title == "Nodes · 2 ready"

        await show(pilot, client, doc_with([LOCAL, DEN_LEFT]))
        den = rows(table)["id-den-pc"]
        assert den[0] == "den-pc" and den[3] == "left 1m05s ago", den
        assert den[4:6] == ["–", "–"] and den[6] == "37/2"  # no load figures, its outcomes kept
        assert all("dim" in s for s in styles(table, "id-den-pc")), styles(table, "id-den-pc")
        assert rows(table)["id-local"][3] == "ready"
        assert table.border_title == "Nodes · 1 ready · 1 left"

        await show(pilot, client, doc_with(None))  # the server restarted without --cluster
        assert not table.display


def test_token_counts_read_short() -> None:
    assert [fmt_tokens(n) for n in (812, 12_345, 999_960, 2_500_000)] == ["812", "12.3k", "1.0M", "2.5M"]
