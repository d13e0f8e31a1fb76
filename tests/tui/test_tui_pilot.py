"""Pilot tests: drive every screen at 80x24 against a real server on loopback (conftest.server_url).

A restart test stops and starts a server under the app: "disconnected", then live again by itself.
The policy test edits through the editor's keys: an invalid edit must show each error at its line and
leave the server's policy alone; a valid one must change what GET /admin/policy answers, and the
history modal must roll it back. Validate (Ctrl+T) is the server's dry run: an error on line 21 is shown
on line 21, and nothing changes. The jobs screen shows what GET /v1/jobs says of a running job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess
from textual.pilot import Pilot
from textual.widgets import DataTable, Label, ListView, OptionList, Static, TextArea
from waiting import await_until

from homeai.jobs.pause_point import PAUSE_MARKER_ENV
from tui.app import MonitorApp
from tui.client import GatewayClient
from tui.screens.jobs import JobItem, JobsScreen
from tui.screens.policy import PolicyScreen
from tui.screens.policy_history import HistoryScreen
from tui.widgets import LatencyChart, StatusLine

pytestmark = pytest.mark.slow
SIZE = (80, 24)


async def wait_for(pilot: Pilot[None], check: Callable[[], object], timeout_s: float = 30.0) -> None:
    await await_until(check, timeout_s, pause=lambda: pilot.pause(0.1))


async def chat(url: str, model: str, user: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        body = {"model": model, "user": user, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        (await http.post("/v1/chat/completions", json=body)).raise_for_status()


def text_of(widget: Static) -> str:
    return str(widget.render())


async def test_dashboard_shows_live_classes_people_and_device(server_url: str) -> None:
    app = MonitorApp(GatewayClient(server_url))
    async with app.run_test(size=SIZE) as pilot:
        await asyncio.gather(chat(server_url, "voice", "kids"), chat(server_url, "chat", "alice"))
        await wait_for(pilot, lambda: app.stats and app.stats.classes["voice"].ttft_samples > 0
                       and "alice" in app.stats.users)
        status = app.screen.query_one(StatusLine)
        await wait_for(pilot, lambda: "live" in text_of(status))
        table = app.screen.query_one("#classes", DataTable)  # drawn from each document as it came
        assert {"voice", "chat"} <= {str(k.value) for k in table.rows}
        voice_chart = app.screen.query_one("#chart-0", LatencyChart)
        assert voice_chart.class_name == "voice" and any(v is not None for v in voice_chart.values)
        assert "KV" in text_of(app.screen.query_one("#device", Static))
        await wait_for(pilot, lambda: "alice" in {r.user for r in app.screen.query("PersonRow")})  # type: ignore[attr-defined]


async def test_requests_screen_lists_recent_requests(server_url: str) -> None:
    await chat(server_url, "voice", "kids")
    app = MonitorApp(GatewayClient(server_url))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        table = app.screen.query_one("#requests", DataTable)
        await wait_for(pilot, lambda: table.row_count > 0)
        row = [str(c) for c in table.get_row_at(0)]
        assert row[2] in {"kids", "alice"} and row[-1] == "ok", row


async def type_at(pilot: Pilot[None], editor: TextArea, needle: str, after: str, keys: list[str]) -> None:
    """Put the cursor just after ``after`` on the first line containing ``needle``, then press ``keys``."""
    line = next(i for i, text in enumerate(editor.text.splitlines()) if needle in text)
    editor.move_cursor((line, editor.document.get_line(line).index(after) + len(after)))
    await pilot.press(*keys)


async def test_policy_editor_invalid_then_valid_then_rollback(server_url: str) -> None:
    original = httpx.get(f"{server_url}/admin/policy").text
    app = MonitorApp(GatewayClient(server_url))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        screen = app.screen
        assert isinstance(screen, PolicyScreen)
        editor = screen.query_one("#editor", TextArea)
        await wait_for(pilot, lambda: editor.text == original)
        assert editor.language == "yaml"  # textual[syntax] is installed: highlighted

        # 1. invalid: a non-number priority and a misspelt key -> two errors at their lines, nothing applied
        await type_at(pilot, editor, "priority: 0 ", "priority: ", ["delete", "x"])
        await type_at(pilot, editor, "max_running: 8 ", "max_runnin", ["delete"])
        await pilot.press("ctrl+s")
        findings = screen.query_one("#findings", OptionList)
        await wait_for(pilot, lambda: findings.option_count == 2)
        labels = [str(findings.get_option_at_index(i).prompt) for i in range(2)]
        voice_line = next(i for i, t in enumerate(original.splitlines(), 1) if "priority: 0 " in t)
        assert any(f"L{voice_line}" in s and "classes.voice.priority" in s for s in labels), labels
        assert any("classes.voice.max_runnin" in s and "unknown key" in s for s in labels), labels
        assert "unchanged" in text_of(screen.query_one("#verdict", Static))
        assert editor.cursor_location[0] + 1 == voice_line  # the editor jumped to the first error
        assert httpx.get(f"{server_url}/admin/policy").text == original

        # 2. valid: reload, lower voice's TTFT target by typing -> applied, the diff shown, the server changed
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: editor.text == original)
        await type_at(pilot, editor, "targets: {ttft_ms: 300", "ttft_ms: 300", ["backspace"] * 3 + ["2", "5", "0"])
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "applied" in text_of(screen.query_one("#verdict", Static)))
        assert "classes.voice.targets.ttft_ms" in str(findings.get_option_at_index(0).prompt)
        assert "ttft_ms: 250" in httpx.get(f"{server_url}/admin/policy").text
        await wait_for(pilot, lambda: app.stats and app.stats.classes["voice"].targets.ttft_ms == 250)

        # 3. history: the previous version is the second row; Enter rolls back to it
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        table = app.screen.query_one("#versions", DataTable)
        # the rows are in and the table has focus before keys go to it (a "down" that lands earlier is lost,
        # and Enter rolls back to the highlighted first row: the running version)
        await wait_for(pilot, lambda: table.row_count >= 2 and table.has_focus)
        await pilot.press("down")
        await wait_for(pilot, lambda: table.cursor_row == 1)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "rolled back" in text_of(screen.query_one("#verdict", Static)))
        assert "ttft_ms: 300" in httpx.get(f"{server_url}/admin/policy").text
        assert editor.text == httpx.get(f"{server_url}/admin/policy").text


def on_line(text: str, number: int, new: str) -> str:
    """``text`` with its line ``number`` (1-based) replaced by ``new``."""
    lines = text.splitlines(keepends=True)
    lines[number - 1] = new + "\n"
    return "".join(lines)


async def test_validate_shows_an_error_on_line_21_on_line_21(server_url: str) -> None:
    """A YAML error on line 21 used to be reported on line 1 (the editor's own check, then key paths
    re-derived by regexes); Validate is now the server's dry run and shows the line the server found."""
    original = httpx.get(f"{server_url}/admin/policy").text
    history = httpx.get(f"{server_url}/admin/policy/history").json()
    line21 = original.splitlines()[20]
    assert line21.strip().startswith("max_running:"), line21  # voice's max_running in the default policy
    app = MonitorApp(GatewayClient(server_url))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        screen = app.screen
        assert isinstance(screen, PolicyScreen)
        editor = screen.query_one("#editor", TextArea)
        findings = screen.query_one("#findings", OptionList)
        verdict = screen.query_one("#verdict", Static)
        await wait_for(pilot, lambda: editor.text == original)

        for broken, path in ((on_line(original, 21, "\t" + line21.lstrip()), "(file)"),  # a tab: YAML syntax
                             (on_line(original, 21, line21.replace(": 8", ": -1", 1)), "classes.voice.max_running")):
            editor.load_text(broken)
            editor.move_cursor((0, 0))
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: findings.option_count == 1 and "✖" in text_of(verdict)  # noqa: B023
                           and path in str(findings.get_option_at_index(0).prompt))  # noqa: B023
            label = str(findings.get_option_at_index(0).prompt)
            assert label.split()[0] == "L21", label
            assert editor.cursor_location[0] + 1 == 21  # the editor jumped to it
            assert httpx.get(f"{server_url}/admin/policy").text == original

        editor.load_text(on_line(original, 21, line21.replace(": 8", ": 6", 1)))
        await pilot.press("ctrl+t")
        await wait_for(pilot, lambda: "valid" in text_of(verdict))
        assert "1 change(s) if applied" in text_of(verdict)
        assert "classes.voice.max_running" in str(findings.get_option_at_index(0).prompt)
    assert httpx.get(f"{server_url}/admin/policy").text == original
    assert httpx.get(f"{server_url}/admin/policy/history").json() == history  # nothing was applied


async def test_jobs_screen_adds_pauses_resumes_and_cancels(tui_server: ServerProcess, tmp_path: Path) -> None:
    """The server's pause point holds the job after its first file, so it is running when the keys land."""
    server_url, marker = tui_server.url, Path(tui_server.env[PAUSE_MARKER_ENV])
    for i in range(3):
        (tmp_path / f"note{i}.txt").write_text(f"note {i}: the boiler is serviced in March.\n" * 20)
    app = MonitorApp(GatewayClient(server_url))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("j")
        screen = app.screen
        assert isinstance(screen, JobsScreen)
        await wait_for(pilot, lambda: screen.available is not None)
        assert screen.available, f"the jobs screen found no jobs API: {text_of(screen.query_one('#jobs-note', Static))}"
        await pilot.press("a", *str(tmp_path), "enter")
        await wait_for(pilot, lambda: len(screen.query(JobItem)) > 0)
        jid = screen.query(JobItem).last().jid

        def state() -> str:
            return str(httpx.get(f"{server_url}/v1/jobs/{jid}").json()["state"])

        await wait_for(pilot, marker.exists, timeout_s=120)  # the first file is embedded on a busy CPU
        assert state() == "running"
        # the row shows the server's own fields: the collection and folder from ``spec``, files and chunks
        # done of their totals from ``progress`` (the job holds still at the pause point)
        row = screen.query(JobItem).last()
        job = httpx.get(f"{server_url}/v1/jobs/{jid}").json()
        progress = job["progress"]
        assert (progress["done_files"], progress["total_files"]) == (1, 3), progress
        figures = f"1/3 files · {progress['done_chunks']}/{progress['total_chunks']} chunks"
        await wait_for(pilot, lambda: figures in str(row.query_one(".pace", Label).render()))
        what = str(row.query_one(".what", Label).render())
        assert f"#{jid} running" in what and f"index {job['spec']['collection']} ←" in what, what
        screen.query_one("#jobs", ListView).index = len(screen.query(JobItem)) - 1
        await pilot.press("space")
        await wait_for(pilot, lambda: "pause" in text_of(screen.query_one("#jobs-note", Static)))
        assert "failed" not in text_of(screen.query_one("#jobs-note", Static))
        assert state() == "paused"
        row = screen.query(JobItem).last()  # space toggles by the state on screen: wait until it shows
        await wait_for(pilot, lambda: "paused" in str(row.query_one(".what", Label).render()))
        await pilot.press("space")
        await wait_for(pilot, lambda: "resume" in text_of(screen.query_one("#jobs-note", Static)))
        assert state() != "paused"
        await pilot.press("x")
        await wait_for(pilot, lambda: "cancel" in text_of(screen.query_one("#jobs-note", Static)))
        await wait_for(pilot, lambda: jid not in {item.jid for item in screen.query(JobItem)})
        assert httpx.get(f"{server_url}/v1/jobs/{jid}").status_code == 404


async def test_reconnects_by_itself_when_the_server_restarts(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                              tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, homeai_cache_dir)
    try:
        await asyncio.to_thread(server.start)
        app = MonitorApp(GatewayClient(server.url))
        async with app.run_test(size=SIZE) as pilot:
            line = app.screen.query_one(StatusLine)
            await wait_for(pilot, lambda: app.connection.connected and app.stats)
            await asyncio.to_thread(server.stop)
            await wait_for(pilot, lambda: line.has_class("-down"))
            assert "disconnected" in text_of(line)
            num_docs = app.history.num_docs
            await asyncio.to_thread(server.start)  # same port, a new process
            await wait_for(pilot, lambda: app.connection.connected and app.history.num_docs > num_docs)
            await wait_for(pilot, lambda: "live" in text_of(line) and not line.has_class("-down"))
    finally:
        server.stop()
