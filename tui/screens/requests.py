"""Requests: the most recent finished requests, newest first, from the stats document's ``recent`` list."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Footer

from tui.documents import RecentRequest
from tui.format import BAD, DIM, GOOD, WARN, fmt_clock, fmt_ms
from tui.monitor import StatsScreen, monitor_of
from tui.widgets import StatusLine

COLUMNS = (("time", "time"), ("class", "class"), ("person", "user"), ("model", "model"),
           ("in→out", "tokens"), ("TTFT", "ttft"), ("total", "e2e"), ("status", "status"))
MODEL_WIDTH = 12  # 80 columns hold every column with the model cut to this
STATUS_STYLE = {"ok": GOOD, "aborted": WARN, "timeout": BAD, "rejected": BAD, "error": BAD}


def request_cells(r: RecentRequest, targets: dict[str, float | None]) -> list[Text | str]:
    """One row; TTFT is red when it missed the class's target."""
    ttft, target = r.ttft_ms, targets.get(r.class_name)
    model = r.model
    return [
        Text(fmt_clock(r.finished_at), style=DIM),
        Text(r.class_name),  # Text, not str: a str cell is markup, and a user named "[/x]" crashed the app
        Text(r.user),
        Text(model if len(model) <= MODEL_WIDTH else model[: MODEL_WIDTH - 1] + "…"),
        Text(f"{r.num_prompt_tokens}→{r.num_output_tokens}", justify="right"),
        Text(fmt_ms(ttft), style=BAD if ttft is not None and target and ttft > target else "", justify="right"),
        Text(fmt_ms(r.e2e_ms), justify="right"),
        Text(r.status, style=STATUS_STYLE.get(r.status, "")),
    ]


class RequestsScreen(StatsScreen):
    """Redrawn only when a new request finished, so the cursor stays where the reader put it."""

    DEFAULT_CSS = "RequestsScreen DataTable { height: 1fr; }"

    def __init__(self) -> None:
        super().__init__()
        self._shown: list[str] = []

    def compose(self) -> ComposeResult:
        yield StatusLine()
        yield DataTable(id="requests", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for label, key in COLUMNS:
            table.add_column(label, key=key)
        self.refresh_stats()

    def on_screen_resume(self) -> None:
        self.refresh_stats()

    def refresh_stats(self) -> None:
        doc = monitor_of(self).stats
        if doc is None or not self.is_mounted:
            return
        recent = doc.recent
        ids = [r.request_id or str(i) for i, r in enumerate(recent)]
        if ids == self._shown:
            return
        targets = {name: c.targets.ttft_ms for name, c in doc.classes.items()}
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        for request_id, r in zip(ids, recent, strict=True):
            table.add_row(*request_cells(r, targets), key=request_id)
        self._shown = ids
        if table.row_count:
            table.move_cursor(row=min(row, table.row_count - 1))
