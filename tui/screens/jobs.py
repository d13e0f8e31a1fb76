"""Jobs: background work (folder indexing, scheduled prompts) with progress bars, rate and ETA.

Polls GET /v1/jobs once a second while shown. Servers without the jobs API (404/405) get a plain
"jobs API not available" line instead of an error. Field names are read tolerantly (``state`` or
``status``; progress at the top level or under ``progress``); a rate the server does not send is
measured here from successive polls.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, ListItem, ListView, ProgressBar, Static

from tui.client import ApiError, GatewayClient, JobsUnavailable
from tui.format import BAD, DIM, GOOD, WARN, fmt_duration
from tui.widgets import StatusLine

STATE_STYLE = {"running": GOOD, "paused": WARN, "failed": BAD, "error": BAD, "cancelled": DIM, "done": DIM}
POLL_S = 1.0


def job_id(job: dict[str, Any]) -> str:
    return str(job.get("id", job.get("job_id", "?")))


def job_fields(job: dict[str, Any]) -> dict[str, Any]:
    """done, total, rate (per s), eta_s, state and a label from whichever shape the server sends."""
    progress: dict[str, Any] = p if isinstance(p := job.get("progress"), dict) else {}

    def pick(*names: str) -> Any:
        for name in names:
            for source in (progress, job):
                if source.get(name) is not None:
                    return source[name]
        return None

    args: dict[str, Any] = a if isinstance(a := job.get("spec") or job.get("args"), dict) else {}
    target = job.get("path") or args.get("path") or job.get("name") or job.get("collection") or ""
    return {"done": pick("done", "done_chunks", "completed"), "total": pick("total", "total_chunks"),
            "rate": pick("rate", "rate_per_s", "chunks_per_s"), "eta_s": pick("eta_s", "eta"),
            "state": str(job.get("state") or job.get("status") or "?"),
            "label": f"{job.get('kind', 'job')} {target}".strip()}


class JobItem(ListItem):
    """One job row: id/kind/target, state, a progress bar, rate and ETA."""

    def __init__(self, jid: str) -> None:
        super().__init__(id=f"job-{jid}" if jid.replace("-", "").isalnum() else None)
        self.jid = jid
        self._last: tuple[float, float] | None = None  # (monotonic s, done) at the previous poll

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label(classes="what")
            yield ProgressBar(total=None, show_eta=False, show_percentage=True, classes="bar")
            yield Label(classes="pace")

    def show(self, job: dict[str, Any]) -> None:
        f = job_fields(job)
        what = Text.assemble((f"#{self.jid} ", "bold"), (f"{f['state']:<9}", STATE_STYLE.get(f["state"], "")),
                             f["label"])
        what.truncate(34, overflow="ellipsis")
        self.query_one(".what", Label).update(what)
        done, total, rate = f["done"], f["total"], f["rate"]
        if done is not None:
            now = time.monotonic()
            if rate is None and f["state"] == "running" and self._last is not None and now > self._last[0]:
                rate = max(float(done) - self._last[1], 0.0) / (now - self._last[0])
            self._last = (now, float(done))
        self.query_one(".bar", ProgressBar).update(total=float(total) if total else None,
                                                   progress=float(done or 0))
        eta = f["eta_s"]
        if eta is None and rate and total is not None and done is not None:
            eta = (float(total) - float(done)) / float(rate)
        pace = f"{float(rate):.1f}/s" if rate is not None else "–/s"
        self.query_one(".pace", Label).update(Text(f"{pace} ETA {fmt_duration(eta)}", style=DIM))


class JobsScreen(Screen[None]):
    """a: add an indexing job · space: pause/resume · x: cancel."""

    BINDINGS = [
        Binding("a", "add", "Add"),
        Binding("space", "toggle_pause", "Pause"),
        Binding("x,delete", "cancel", "Cancel"),
        Binding("escape", "leave_input", show=False),
    ]
    DEFAULT_CSS = """
    JobsScreen #jobs-note { height: auto; padding: 0 1; }
    JobsScreen #jobs { height: 1fr; }
    JobsScreen JobItem Horizontal { height: 1; }
    JobsScreen .what { width: 36; }
    JobsScreen .bar { width: 1fr; }
    JobsScreen .bar Bar { width: 1fr; }
    JobsScreen .pace { width: 18; padding-left: 1; }
    JobsScreen #add { height: 3; }
    JobsScreen #folder { width: 1fr; }
    JobsScreen #collection { width: 20; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.available: bool | None = None
        self.last_action: Text | None = None

    @property
    def client(self) -> GatewayClient:
        return self.app.client  # type: ignore[attr-defined, no-any-return]

    def compose(self) -> ComposeResult:
        yield StatusLine()
        yield Static(Text("loading jobs…", style=DIM), id="jobs-note")
        yield ListView(id="jobs")
        with Horizontal(id="add"):
            yield Input(placeholder="folder to index (a, then Enter)", id="folder")
            yield Input(placeholder="collection", id="collection")
        yield Footer()

    def on_mount(self) -> None:
        self.timer = self.set_interval(POLL_S, self.poll)
        self.poll()
        self.query_one("#jobs", ListView).focus()

    def on_screen_suspend(self) -> None:
        self.timer.pause()

    def on_screen_resume(self) -> None:
        self.timer.resume()

    def note(self, message: str, style: str = DIM) -> None:
        """The line above the list: the job count, then the outcome of the last action (kept until the
        next one, so a poll does not wipe it before it is read)."""
        line = Text(message, style=style)
        if self.last_action is not None:
            line.append(" · ", DIM).append_text(self.last_action)
        self.query_one("#jobs-note", Static).update(line)

    def tell(self, message: str, style: str) -> None:
        self.last_action = Text(message, style=style)
        self.note(f"{len(self.jobs)} job(s)")

    @work(exclusive=True, group="jobs-poll")
    async def poll(self) -> None:
        try:
            jobs = await self.client.list_jobs()
        except JobsUnavailable:
            self.available = False
            self.note("jobs API not available on this server (GET /v1/jobs: not found)", WARN)
            return
        except ApiError as e:
            self.note(f"cannot list jobs: {e.message}", BAD)
            return
        self.available = True
        self.jobs = {job_id(j): j for j in jobs}
        self.note(f"{len(jobs)} job(s)" if jobs else "no jobs yet · a adds a folder to index")
        await self._reconcile()

    async def _reconcile(self) -> None:
        view = self.query_one("#jobs", ListView)
        items = {item.jid: item for item in view.query(JobItem)}
        for jid in items.keys() - self.jobs.keys():
            await items.pop(jid).remove()
        for jid, job in self.jobs.items():
            if jid not in items:
                items[jid] = JobItem(jid)
                await view.append(items[jid])
            items[jid].show(job)
        if view.index is None and items:
            view.index = 0

    def selected(self) -> str | None:
        item = self.query_one("#jobs", ListView).highlighted_child
        return item.jid if isinstance(item, JobItem) else None

    def action_add(self) -> None:
        self.query_one("#folder", Input).focus()

    def action_leave_input(self) -> None:
        self.query_one("#jobs", ListView).focus()

    def action_toggle_pause(self) -> None:
        jid = self.selected()
        if jid is not None:
            paused = job_fields(self.jobs.get(jid, {}))["state"] == "paused"
            self.act(jid, "resume" if paused else "pause")

    def action_cancel(self) -> None:
        jid = self.selected()
        if jid is not None:
            self.act(jid, "cancel")

    @work(group="jobs-act")
    async def act(self, jid: str, action: str) -> None:
        try:
            await self.client.job_action(jid, action)
        except ApiError as e:
            self.tell(f"{action} #{jid} failed: {e.message}", BAD)
            return
        self.tell(f"{action} #{jid}: done", GOOD)
        self.poll()

    @on(Input.Submitted)
    def submit_folder(self) -> None:
        folder = self.query_one("#folder", Input).value.strip()
        if folder:
            self.add_job(folder, self.query_one("#collection", Input).value.strip() or None)

    @work(group="jobs-act")
    async def add_job(self, folder: str, collection: str | None) -> None:
        try:
            job = await self.client.add_index_job(folder, collection)
        except ApiError as e:
            self.tell(f"cannot add the job: {e.message}", BAD)
            return
        self.query_one("#folder", Input).value = ""
        self.tell(f"added job #{job_id(job)}: index {folder}", GOOD)
        self.action_leave_input()
        self.poll()
