"""`homeai tui [--url URL] [--key KEY]`: the terminal monitor (code in the top-level `tui/` package).

The monitor speaks only HTTP to the server, so this command imports nothing of the server's and works
against a gateway on another machine as well as on this one.
"""

from __future__ import annotations

import argparse
import os

DEFAULT_URL = "http://127.0.0.1:8000"


def add_tui_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tui", help="terminal monitor: live latency, people, policy editor, jobs")
    p.add_argument("--url", default=os.environ.get("HOMEAI_URL", DEFAULT_URL),
                   help=f"the gateway's base URL (default: $HOMEAI_URL or {DEFAULT_URL})")
    p.add_argument("--key", default=os.environ.get("HOMEAI_API_KEY"),
                   help="an API key (admin for the policy editor), sent as a Bearer token "
                        "(default: $HOMEAI_API_KEY)")
    p.set_defaults(func=cmd_tui)


def cmd_tui(args: argparse.Namespace) -> int:
    from tui.app import MonitorApp
    from tui.client import GatewayClient

    MonitorApp(GatewayClient(args.url, args.key)).run()
    return 0
