"""The monitor app: four screens (Textual modes, so each keeps its state) fed by one stats stream.

The app owns the client and the stream worker; each document goes into ``stats`` (the latest) and
``history`` (how it moved), and the visible screen redraws from them. Keys switch screens from
anywhere except inside a text field (Esc leaves the policy editor).
"""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive

from tui.client import Connection, GatewayClient
from tui.history import StatsHistory
from tui.screens.dashboard import DashboardScreen
from tui.screens.jobs import JobsScreen
from tui.screens.policy import PolicyScreen
from tui.screens.requests import RequestsScreen


class MonitorApp(App[None]):
    """``homeai tui``: dashboard, policy editor, jobs and recent requests over the HTTP API."""

    TITLE = "HomeAI"
    MODES = {"dashboard": DashboardScreen, "policy": PolicyScreen, "jobs": JobsScreen,
             "requests": RequestsScreen}
    DEFAULT_MODE = "dashboard"
    ENABLE_COMMAND_PALETTE = False  # every action has a key in the footer; the palette only costs its width
    BINDINGS = [
        Binding("d", "switch_mode('dashboard')", "Dash"),
        Binding("p", "switch_mode('policy')", "Policy"),
        Binding("j", "switch_mode('jobs')", "Jobs"),
        Binding("r", "switch_mode('requests')", "Reqs"),
        Binding("q", "quit", "Quit"),
    ]

    connection: reactive[Connection] = reactive(Connection(False, "connecting"), always_update=True)
    stats: reactive[dict[str, Any] | None] = reactive(None, always_update=True)

    def __init__(self, client: GatewayClient, *, follow: bool = True) -> None:
        super().__init__()
        self.client = client
        self.url = client.base_url
        self.history = StatsHistory()
        self.follow = follow

    def on_mount(self) -> None:
        if self.follow:
            self.follow_stats()

    @work(exclusive=True, group="stats")
    async def follow_stats(self) -> None:
        """Runs for the app's life; the client reconnects by itself and reports each change."""
        async for event in self.client.stats_events():
            if isinstance(event, Connection):
                self.connection = event
            else:
                self.add_stats(event)

    def add_stats(self, doc: dict[str, Any]) -> None:
        """One stats document: remember it, then let the visible screen redraw."""
        self.history.add(doc)
        self.stats = doc

    def watch_stats(self, doc: dict[str, Any] | None) -> None:
        refresh = getattr(self.screen, "refresh_stats", None)
        if doc is not None and callable(refresh):
            refresh()

    async def on_unmount(self) -> None:
        await self.client.aclose()
