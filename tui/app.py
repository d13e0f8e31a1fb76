"""The monitor app: four screens (Textual modes, so each keeps its state) fed by one stats stream.

The app owns the client and the stream worker (``tui.monitor.Monitor``); each document goes into
``stats`` (the latest, a typed ``StatsDoc``) and ``history`` (how it moved), and the visible screen
redraws from them. Keys switch screens from anywhere except inside a text field (Esc leaves the policy
editor).
"""

from __future__ import annotations

from textual.binding import Binding

from tui.monitor import Monitor
from tui.screens.dashboard import DashboardScreen
from tui.screens.jobs import JobsScreen
from tui.screens.policy import PolicyScreen
from tui.screens.requests import RequestsScreen


class MonitorApp(Monitor):
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
