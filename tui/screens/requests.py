"""Requests: the most recent finished requests, newest first, from the stats document's ``recent`` list."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer

from tui.format import BAD, DIM, GOOD, WARN, fmt_clock, fmt_ms
from tui.widgets import StatusLine

COLUMNS = (("time", "time"), ("class", "class"), ("person", "user"), ("model", "model"),
           ("in→out", "tokens"), ("TTFT", "ttft"), ("total", "e2e"), ("status", "status"))
MODEL_WIDTH = 12  # 80 columns hold every column with the model cut to this
STATUS_STYLE = {"ok": GOOD, "aborted": WARN, "timeout": BAD, "rejected": BAD, "error": BAD}


def request_cells(r: dict[str, Any], targets: dict[str, float | None]) -> list[Text | str]:
    """One row; TTFT is red when it missed the class's target."""
    ttft, target = r.get("ttft_ms"), targets.get(str(r.get("class_name")))
    model = str(r.get("model", ""))
    status = str(r.get("status", ""))
    return [
        Text(fmt_clock(r.get("finished_at")), style=DIM),
        str(r.get("class_name", "")),
        str(r.get("user", "")),
        model if len(model) <= MODEL_WIDTH else model[: MODEL_WIDTH - 1] + "…",
        Text(f"{r.get('num_prompt_tokens', 0)}→{r.get('num_output_tokens', 0)}", justify="right"),
        Text(fmt_ms(ttft), style=BAD if ttft is not None and target and ttft > target else "", justify="right"),
        Text(fmt_ms(r.get("e2e_ms")), justify="right"),
        Text(status, style=STATUS_STYLE.get(status, "")),
    ]


class RequestsScreen(Screen[None]):
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
        doc: dict[str, Any] | None = getattr(self.app, "stats", None)
        if not doc or not self.is_mounted:
            return
        recent = [r for r in doc.get("recent") or [] if isinstance(r, dict)]
        ids = [str(r.get("request_id", i)) for i, r in enumerate(recent)]
        if ids == self._shown:
            return
        targets = {name: (c.get("targets") or {}).get("ttft_ms") for name, c in (doc.get("classes") or {}).items()}
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        for request_id, r in zip(ids, recent, strict=True):
            table.add_row(*request_cells(r, targets), key=request_id)
        self._shown = ids
        if table.row_count:
            table.move_cursor(row=min(row, table.row_count - 1))
