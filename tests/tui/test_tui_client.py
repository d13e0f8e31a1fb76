"""The TUI's parts that need no model server: the SSE feed reconnecting, error bodies with their lines,
the chart and history maths, the jobs screen on /v1/jobs's documents, and the rule that the TUI imports
nothing from ``homeai``."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from textual.widgets import OptionList, Static, TextArea
from tui_helpers import ReplayClient
from waiting import await_until

from tui.app import MonitorApp
from tui.client import ApiError, Connection, GatewayClient, JobsUnavailable, SseParser
from tui.documents import JobView, StatsDoc, convert
from tui.history import StatsHistory
from tui.screens.dashboard import chart_classes
from tui.screens.jobs import job_line, job_pace
from tui.widgets import StatusLine, chart_rows

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_tui_imports_nothing_from_homeai() -> None:
    code = ("import sys, tui.app, tui.client\n"
            "print([m for m in sys.modules if m == 'homeai' or m.startswith('homeai.')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_sse_parser_joins_data_lines_and_names_events() -> None:
    parser = SseParser()
    lines = [": keep-alive", "event: stats", 'data: {"a":', "data: 1}", "", "data: x", ""]
    events = [e for e in (parser.feed(line) for line in lines) if e is not None]
    assert events == [("stats", '{"a":\n1}'), ("message", "x")]


async def test_errors_keep_key_paths_and_jobs_404_is_unavailable() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/admin/policy":
            return httpx.Response(422, json={"error": {"message": "invalid policy (1 error)", "errors": [
                {"path": "classes.voice.priority", "message": "must be >= 0", "line": 13}]}})
        return httpx.Response(404, json={"status_code": 404, "detail": "Not Found"})

    client = GatewayClient("http://x", key="k", transport=httpx.MockTransport(answer))
    assert client.http.headers["authorization"] == "Bearer k"
    with pytest.raises(ApiError) as failed:
        await client.put_policy("classes: {}")
    assert failed.value.status == 422
    assert (failed.value.errors[0].path, failed.value.errors[0].line) == ("classes.voice.priority", 13)
    with pytest.raises(JobsUnavailable):
        await client.list_jobs()
    assert await client.validate_policy("x: 1") is None  # no dry-run endpoint: never falls back to PUT
    await client.aclose()


def test_chart_marks_misses_and_history_buckets_by_server_time() -> None:
    rows = chart_rows([100.0, None, 400.0], target=300.0, rows=4)
    assert len(rows) == 4 and all(len(r) == 3 for r in rows)
    assert rows[-1].plain[0] != " " and rows[0].plain[2] == "█"  # both drawn; 400 reaches the top
    history = StatsHistory()
    for t, p99 in ((1000.0, 50.0), (1160.0, 80.0), (1170.0, 60.0)):
        history.add(convert({"time": t, "classes": {"voice": {"ttft_p50_ms": 1.0, "ttft_p99_ms": p99}},
                             "users": {"kids": {"tokens_per_s_10s": p99 / 10}}}, StatsDoc))
    assert history.ttft_buckets("voice", 3, span_s=180.0) == [50.0, None, 80.0]
    assert history.rate_buckets("kids", 3, span_s=180.0) == [5.0, 0.0, 8.0]
    assert history.peak_rate() == 8.0


def test_people_and_classes_the_server_no_longer_reports_leave_the_history_and_charts() -> None:
    """After a server restart a person missing from the new documents kept their old samples, so their old
    peak set every sparkline's scale; a class renamed away (still reported, without a priority, while its
    figures last) kept its chart and the new class got none."""
    history = StatsHistory()
    history.add(convert({"time": 1000.0, "users": {"alice": {"tokens_per_s_10s": 250.0},
                                                   "bob": {"tokens_per_s_10s": 5.0}}}, StatsDoc))
    for t in (1200.0, 1600.0):  # the restarted server reports bob alone
        history.add(convert({"time": t, "users": {"bob": {"tokens_per_s_10s": 5.0}}}, StatsDoc))
    assert "alice" not in history.user_rate and history.peak_rate() == 5.0
    doc = convert({"time": 1.0, "classes": {"chat": {"kind": "llm"},
                                           "assistant": {"kind": "llm", "priority": 1}}}, StatsDoc)
    assert chart_classes(doc.classes) == ["assistant"]


def job_doc(jid: int, state: str = "running", **spec: object) -> dict[str, object]:
    """A job as GET /v1/jobs sends it (homeai/api/jobs_schemas.py JobView)."""
    return {"id": jid, "kind": "index", "state": state,
            "spec": spec or {"path": "/home/docs", "collection": "docs"}, "schedule": None, "next_run_at": None,
            "progress": {"done_chunks": 40, "total_chunks": 100, "done_files": 2, "total_files": 5,
                         "phase": "embedding", "chunks_per_s": 8.0, "eta_s": 7.5},
            "error": None, "created_by": "anonymous", "created_at": "2026-01-01T08:00:00+00:00",
            "started_at": "2026-01-01T08:00:01+00:00", "finished_at": None, "runs": []}


def test_jobs_read_the_fields_the_server_sends() -> None:
    job = convert(job_doc(1), JobView)
    assert job_line(job).plain == "#1 running  index docs ← /home/docs · embedding"
    assert job_pace(job).plain == "2/5 files · 40/100 chunks · 8.0/s · ETA 7s"
    failed = convert({**job_doc(2, "failed"), "error": "folder vanished"}, JobView)
    assert job_line(failed).plain.endswith("· folder vanished")
    assert job_pace(failed).plain == "2/5 files · 40/100 chunks"  # no rate once it stopped
    with pytest.raises(ValueError):  # a job without its id is not a job: refused, not guessed at
        convert({"kind": "index", "state": "running"}, JobView)


# ---- the stats feed: disconnected, then live when a server appears, then disconnected again ------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sse_server() -> Iterator[tuple[int, threading.Event, threading.Event]]:
    """(port, start, stop): set ``start`` to serve /v1/stats/stream on ``port``, ``stop`` to go away."""
    port, start, stop = _free_port(), threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            while not stop.is_set():
                doc = {"time": time.time(), "uptime_s": 1.0, "classes": {}, "users": {}, "device": {}}
                self.wfile.write(f"event: stats\ndata: {json.dumps(doc)}\n\n".encode())
                self.wfile.flush()
                stop.wait(0.1)  # the server's pace: an event every 0.1 s until it goes away

        def log_message(self, *args: object) -> None:
            pass

    def serve() -> None:
        start.wait()
        with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stop.wait()
            server.shutdown()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, start, stop
    start.set()
    stop.set()
    thread.join(timeout=5)


async def test_stats_feed_shows_disconnected_and_reconnects_by_itself(
        sse_server: tuple[int, threading.Event, threading.Event]) -> None:
    port, start, stop = sse_server
    app = MonitorApp(GatewayClient(f"http://127.0.0.1:{port}"))
    async with app.run_test(size=(80, 24)) as pilot:
        line = app.screen.query_one(StatusLine)

        async def until(check: Callable[[], object]) -> None:
            await await_until(check, pause=lambda: pilot.pause(0.1))

        await until(lambda: line.has_class("-down") and "disconnected" in str(Static.render(line)))
        start.set()
        await until(lambda: app.connection.connected and app.stats is not None)
        assert "live" in str(line.render())
        stop.set()
        await until(lambda: not app.connection.connected)
        assert "disconnected" in str(line.render())


async def test_a_stats_body_that_cannot_be_decoded_is_a_disconnection_not_a_crash() -> None:
    """httpx's DecodingError is no TransportError: a proxy that sent a gzip header over a plain body ended the
    stats worker, and the whole app with it."""
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream", "Content-Encoding": "gzip"},
                              content=b"not gzip at all")

    client = GatewayClient("http://x", transport=httpx.MockTransport(answer))
    events = client.stats_events()
    first = await anext(events)
    await events.aclose()
    assert isinstance(first, Connection) and not first.connected and "bad data" in first.detail


async def test_the_policy_editor_applies_on_the_version_it_loaded() -> None:
    """Ctrl+S sends back the version the editor loaded (If-Match), so a change made in between (a file edit,
    another admin) is a 412 instead of being silently undone; after an apply the next one is based on it."""
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, text="classes: {}\n", headers={"ETag": '"5"'})
        seen.append(request.headers.get("If-Match"))
        return httpx.Response(200, json={"changed": True, "diff": [], "swap_version": 6}, headers={"ETag": '"6"'})

    client = GatewayClient("http://x", transport=httpx.MockTransport(answer))
    await client.get_policy()
    await client.put_policy("classes: {}\n")
    await client.put_policy("classes: {}\n")
    assert seen == ['"5"', '"6"']


class FakeJobsApi:
    """/v1/jobs in memory, answering the server's documents (``job_doc``)."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, object]] = {"1": job_doc(1)}
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        self.calls.append(f"{method} {path}")
        if path == "/v1/jobs" and method == "GET":
            return httpx.Response(200, json={"jobs": list(self.jobs.values())})
        if path == "/v1/jobs" and method == "POST":
            body = json.loads(request.content)
            jid = len(self.jobs) + 1
            job = {**job_doc(jid, "queued", path=body["path"], collection=body["collection"]),
                   "progress": {"done_chunks": 0, "total_chunks": 0, "done_files": 0, "total_files": 0,
                                "phase": None, "chunks_per_s": 0.0, "eta_s": None}}
            self.jobs[str(jid)] = job
            return httpx.Response(201, json=job)
        jid, _, action = path.removeprefix("/v1/jobs/").partition("/")
        if jid not in self.jobs:
            return httpx.Response(404, json={"detail": "no such job"})
        if method == "DELETE":
            del self.jobs[jid]
        else:
            self.jobs[jid]["state"] = {"pause": "paused", "resume": "running"}[action]
        return httpx.Response(200, json=self.jobs.get(jid, {}))


async def test_jobs_screen_pause_resume_cancel_and_add(tmp_path: Path) -> None:
    api = FakeJobsApi()
    app = MonitorApp(GatewayClient("http://fake", transport=httpx.MockTransport(api)), follow=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("j")
        screen = app.screen

        async def until(check: Callable[[], object]) -> None:
            await await_until(check, pause=lambda: pilot.pause(0.05), what=lambda: f"{check}; calls: {api.calls}")

        await until(lambda: screen.query("JobItem"))
        item = screen.query_one("JobItem")
        bar = item.query_one(".bar")
        assert bar.total == 100 and bar.progress == 40  # type: ignore[attr-defined]
        assert "8.0/s" in str(item.query_one(".pace").render())
        await pilot.press("space")
        await until(lambda: api.jobs["1"]["state"] == "paused")
        await until(lambda: "paused" in str(item.query_one(".what").render()))
        await pilot.press("space")
        await until(lambda: api.jobs["1"]["state"] == "running")
        await pilot.press("a", *str(tmp_path / "photos"), "enter")
        await until(lambda: "2" in api.jobs)
        assert api.jobs["2"]["spec"] == {"path": str(tmp_path / "photos"), "collection": "photos"}
        await until(lambda: len(screen.query("JobItem")) == 2)
        await pilot.press("up", "x")  # the highlighted job is cancelled
        await until(lambda: len(api.jobs) == 1)
        await until(lambda: len(screen.query("JobItem")) == 1)


def test_cli_registers_tui_with_url_and_key() -> None:
    from homeai.cli.tui_cmd import add_tui_command, cmd_tui

    parser = argparse.ArgumentParser()
    add_tui_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tui", "--url", "http://box:8000", "--key", "secret"])
    assert (args.url, args.key, args.func) == ("http://box:8000", "secret", cmd_tui)


async def test_validate_is_the_servers_dry_run_with_its_lines() -> None:
    """Ctrl+T asks the server (POST /admin/policy/validate) and lists each error at the line the server
    gave; it never applies. Before, a local tree-sitter check put most YAML errors on line 1."""
    client = ReplayClient(docs=[])
    app = MonitorApp(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("p")
        editor = app.screen.query_one("#editor", TextArea)
        while editor.text != client.policy_text:
            await pilot.pause(0.05)
        editor.load_text(client.invalid_text)
        await pilot.press("ctrl+t")
        findings = app.screen.query_one("#findings", OptionList)
        while findings.option_count < 3:
            await pilot.pause(0.05)
        labels = [str(findings.get_option_at_index(i).prompt) for i in range(3)]
        assert [label.split()[0] for label in labels] == ["L13", "L41", "L38"], labels
        assert editor.cursor_location[0] + 1 == 13  # the editor jumped to the first
        assert client.put_texts == []  # validate never applies
        editor.load_text(client.policy_text)
        await pilot.press("ctrl+t")
        verdict = app.screen.query_one("#verdict", Static)
        while "valid" not in str(verdict.render()):
            await pilot.pause(0.05)
        assert "same as the running policy" in str(verdict.render()) and findings.option_count == 0
        assert client.put_texts == []
