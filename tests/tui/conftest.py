"""A real server for the TUI's Pilot tests, started by the shared launcher (tests/server_launcher.py).

It runs the default policy (copied into its data directory on first start), so applying policies from
the editor never touches a file in the repository. A server that cannot start fails the tests, with its log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_launcher import running_server


@pytest.fixture(scope="module")
def server_url(pulled_models: dict[str, Path], homeai_cache_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running server."""
    with running_server(tmp_path_factory.mktemp("tui-server"), homeai_cache_dir) as server:
        yield server.url
