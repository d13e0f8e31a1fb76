"""Applied policy versions, newest first; Enter rolls back to the highlighted one (dismisses with it)."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from tui.client import ApiError, GatewayClient
from tui.format import BAD, DIM, GOOD
from tui.monitor import reply


def when(iso: str) -> str:
    """An ISO time as local 'YYYY-MM-DD HH:MM' (as sent when it does not parse)."""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except (TypeError, ValueError):
        return str(iso)


class HistoryScreen(ModalScreen[int | None]):
    """A modal over the editor, so the edit in progress is still there when it closes."""

    BINDINGS = [
        Binding("enter", "rollback", "Roll back", priority=True),
        Binding("escape", "dismiss_none", "Close"),
    ]
    DEFAULT_CSS = """
    HistoryScreen { align: center middle; }
    HistoryScreen > Vertical { width: 76; max-width: 100%; height: 18; max-height: 100%;
                               border: round $primary; background: $surface; }
    HistoryScreen DataTable { height: 1fr; }
    HistoryScreen #hint { height: 1; }
    """

    def __init__(self, client: GatewayClient) -> None:
        super().__init__()
        self.client = client

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Policy history"
            yield DataTable(id="versions", cursor_type="row")
            yield Static(Text("loading…", style=DIM), id="hint")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for label in ("", "version", "applied", "by", "note"):
            table.add_column(label, key=label or "mark")
        self.load()

    @work(exclusive=True)
    async def load(self) -> None:
        hint = self.query_one("#hint", Static)
        try:
            body = await reply(self, self.client.policy_history())
        except ApiError as e:
            hint.update(Text(f"✖ {e.message}", style=BAD))
            return
        table = self.query_one(DataTable)
        for v in body.versions:
            mark = Text("●", style=GOOD) if v.version == body.current else ""
            # Text, not str: the server's words are not markup
            table.add_row(mark, str(v.version), when(v.applied_at), Text(v.applied_by), Text(v.note or ""),
                          key=str(v.version))
        hint.update(Text("● running · Enter rolls back to the highlighted version · Esc closes", style=DIM))
        table.focus()

    def action_rollback(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        self.dismiss(int(str(key)))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
