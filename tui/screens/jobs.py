"""Jobs: background work (folder indexing, scheduled prompts, retention) with progress bars, rate and ETA.

Polls GET /v1/jobs once a second while shown and reads its jobs as ``tui.documents.JobView`` (the server's
``homeai/api/jobs_schemas.py`` JobView): ``state``, the folder and collection in ``spec``, and in
``progress`` files and chunks done of their totals, ``chunks_per_s``, ``eta_s`` and the ``phase``. Servers
without the jobs API (404/405) get a plain "jobs API not available" line instead of an error.
"""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, ListItem, ListView, ProgressBar, Static

from tui.client import ApiError, GatewayClient, JobsUnavailable
from tui.documents import JobView
from tui.format import BAD, DIM, GOOD, WARN, fmt_duration
from tui.monitor import monitor_of, reply
from tui.widgets import StatusLine

STATE_STYLE = {"running": GOOD, "queued": "", "paused": WARN, "failed": BAD, "done": DIM}
POLL_S = 1.0


def job_line(job: JobView) -> Text:
    """The first line of a job: id, state, kind and what it works on (a failed job: why)."""
    line = Text.assemble((f"#{job.id} ", "bold"), (f"{job.state:<8}", STATE_STYLE.get(job.state, "")), " ",
                         (job.kind, DIM), " ", job.target())
    if job.state == "failed" and job.error:
        line.append(f" · {job.error}", BAD)
    elif job.progress.phase and job.state == "running":
        line.append(f" · {job.progress.phase}", DIM)
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def job_pace(job: JobView) -> Text:
    """The second line's figures: files and chunks done of their totals, chunks/s and the ETA while it
    runs; for a job without counted work, its schedule."""
    p = job.progress
    if not p.total_files and not p.total_chunks and not p.done_chunks:
        when = f"{job.schedule} · next {job.next_run_at}" if job.schedule and job.next_run_at else job.schedule
        return Text(when or "–", style=DIM)
    out = Text.assemble(f"{p.done_files}/{p.total_files}", (" files · ", DIM), f"{p.done_chunks}/{p.total_chunks}",
                        (" chunks", DIM))
    if job.state == "running":
        out.append_text(Text.assemble((" · ", DIM), f"{p.chunks_per_s:.1f}/s", (" · ETA ", DIM),
                                      fmt_duration(p.eta_s)))
    return out


class JobItem(ListItem):
    """One job: id, state, kind and target on the first line; a progress bar and its figures below."""

    def __init__(self, jid: int) -> None:
        super().__init__(id=f"job-{jid}")
        self.jid = jid

    def compose(self) -> ComposeResult:
        yield Label(classes="what")
        with Horizontal():
            yield ProgressBar(total=None, show_eta=False, show_percentage=True, classes="bar")
            yield Label(classes="pace")

    def show(self, job: JobView) -> None:
        self.query_one(".what", Label).update(job_line(job))
        p = job.progress
        total = p.total_chunks or p.total_files
        done = p.done_chunks if p.total_chunks else p.done_files
        if job.state == "done":
            total, done = total or 1, total or 1
        self.query_one(".bar", ProgressBar).update(total=float(total) if total else None, progress=float(done))
        self.query_one(".pace", Label).update(job_pace(job))


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
    JobsScreen JobItem { height: 2; }
    JobsScreen JobItem Horizontal { height: 1; }
    JobsScreen .what { width: 1fr; }
    JobsScreen .bar { width: 1fr; }
    JobsScreen .bar Bar { width: 1fr; }
    JobsScreen .pace { width: 44; padding-left: 1; }
    JobsScreen #add { height: 3; }
    JobsScreen #folder { width: 1fr; }
    JobsScreen #collection { width: 20; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[int, JobView] = {}
        self._polling = False  # a poll is under way; one asked meanwhile runs when it ends
        self._poll_again = False
        self.available: bool | None = None
        self.last_action: Text | None = None

    @property
    def client(self) -> GatewayClient:
        return monitor_of(self).client

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

    def poll(self) -> None:
        """Lists the jobs and redraws them. Polls run one after another, never cancelled: an exclusive worker
        cancelled inside ``_reconcile`` (a list item half mounted or removed) left the ListView waiting on
        its children for good, and the screen stopped taking keys."""
        if self._polling:
            self._poll_again = True
            return
        self._polling = True
        self._poll_worker()

    @work(group="jobs-poll")
    async def _poll_worker(self) -> None:
        try:
            while True:
                self._poll_again = False
                await self._poll_once()
                if not self._poll_again:
                    return
        finally:
            self._polling = False

    async def _poll_once(self) -> None:
        try:
            jobs = await reply(self, self.client.list_jobs())
        except JobsUnavailable:
            self.available = False
            self.note("jobs API not available on this server (GET /v1/jobs: not found)", WARN)
            return
        except ApiError as e:
            self.note(f"cannot list jobs: {e.message}", BAD)
            return
        self.available = True
        self.jobs = {j.id: j for j in jobs}
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

    def selected(self) -> int | None:
        item = self.query_one("#jobs", ListView).highlighted_child
        return item.jid if isinstance(item, JobItem) else None

    def action_add(self) -> None:
        self.query_one("#folder", Input).focus()

    def action_leave_input(self) -> None:
        self.query_one("#jobs", ListView).focus()

    def action_toggle_pause(self) -> None:
        jid = self.selected()
        job = self.jobs.get(jid) if jid is not None else None
        if job is not None:
            self.act(job.id, "resume" if job.state == "paused" else "pause")

    def action_cancel(self) -> None:
        jid = self.selected()
        if jid is not None:
            self.act(jid, "cancel")

    @work(group="jobs-act")
    async def act(self, jid: int, action: str) -> None:
        try:
            await reply(self, self.client.job_action(jid, action))
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
            job = await reply(self, self.client.add_index_job(folder, collection))
        except ApiError as e:
            self.tell(f"cannot add the job: {e.message}", BAD)
            return
        self.query_one("#folder", Input).value = ""
        self.tell(f"added job #{job.id}: index {folder} into {job.spec.get('collection', '?')}", GOOD)
        self.action_leave_input()
        self.poll()
