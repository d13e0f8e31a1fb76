"""What every screen and widget shares, typed: the app's client, connection, latest stats and history.

``Monitor`` is the app without its screens (``tui.app.MonitorApp`` adds them), so that screens and widgets
can name the app's type without importing the module that imports them. They reach it through
``monitor_of(node)``, which checks the type instead of guessing attributes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from textual import work
from textual.app import App
from textual.dom import DOMNode
from textual.reactive import reactive
from textual.screen import Screen

from tui.client import Connection, GatewayClient
from tui.documents import StatsDoc
from tui.history import StatsHistory

T = TypeVar("T")


class StatsScreen(Screen[None]):
    """A screen drawn from the stats feed: the app calls ``refresh_stats`` for each document while it is
    the visible one."""

    def refresh_stats(self) -> None:
        """Draw ``monitor_of(self).stats``."""


class Monitor(App[None]):
    """The app's state: one client, one stats stream feeding ``stats`` (the latest) and ``history``."""

    connection: reactive[Connection] = reactive(Connection(False, "connecting"), always_update=True)
    stats: reactive[StatsDoc | None] = reactive(None, always_update=True)

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

    def add_stats(self, doc: StatsDoc) -> None:
        """One stats document: remember it, then let the visible screen redraw."""
        self.history.add(doc)
        self.stats = doc

    def watch_stats(self, doc: StatsDoc | None) -> None:
        """Redraws the visible stats screen while the app runs. A document can still arrive while it shuts
        down, as its screens' widgets are removed or after the screens are gone: drawing then would fail the
        stream worker (NoMatches, ScreenStackError), and the app with it."""
        if doc is not None and self.is_running and self.screen_stack and isinstance(self.screen, StatsScreen):
            self.screen.refresh_stats()

    async def on_unmount(self) -> None:
        await self.client.aclose()


def monitor_of(node: DOMNode) -> Monitor:
    """The ``Monitor`` a screen or widget runs in (TypeError under any other app)."""
    app = node.app
    if not isinstance(app, Monitor):
        raise TypeError(f"{type(node).__name__} runs in a tui Monitor app, not {type(app).__name__}")
    return app


async def reply(node: DOMNode, call: Awaitable[T]) -> T:
    """``await call`` (a server request) in a worker of ``node``. Once the app is shutting down, the worker
    ends as cancelled instead of drawing the answer (or the error): the widgets it would update are being
    removed, and a failed query there (NoMatches) would fail the worker and the app with it."""
    try:
        return await call
    finally:
        if not node.app.is_running:
            raise asyncio.CancelledError  # noqa: B012 - the answer, or its error, has nowhere to go
