"""A real server for the TUI's Pilot tests: `homeai serve` on a free loopback port, data in tmp.

It runs the default policy (copied into its data directory on first start), so applying policies from
the editor never touches a file in the repository. Skips, saying why, where `homeai serve` is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tui_helpers import LoopbackServer, serve_unavailable


@pytest.fixture(scope="module")
def server_url(homeai_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running server (its log is shown if it fails to start)."""
    why = serve_unavailable()
    if why is not None:
        pytest.skip(why)
    server = LoopbackServer(tmp_path_factory.mktemp("tui-server"), homeai_cache_dir)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()
