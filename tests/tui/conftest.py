"""A real server for the TUI's Pilot tests, started by the shared launcher (tests/server_launcher.py).

It runs the default policy (copied into its data directory on first start), so applying policies from
the editor never touches a file in the repository. A server that cannot start fails the tests, with its log.
Its indexer's test-only pause point is armed: an indexing job blocks after its first file (and writes
the file its HOMEAI_TEST_PAUSE_MARKER names), so the jobs screen always meets a job that is running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_launcher import ServerProcess, running_server

from homeai.jobs.pause_point import PAUSE_AFTER_FILES_ENV, PAUSE_MARKER_ENV


@pytest.fixture(scope="module")
def tui_server(pulled_models: dict[str, Path], homeai_cache_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data_dir = tmp_path_factory.mktemp("tui-server")
    env = {PAUSE_AFTER_FILES_ENV: "1", PAUSE_MARKER_ENV: str(data_dir / "index-paused"),
           "HOMEAI_JOB_ROOTS": str(data_dir.parent)}  # the jobs screen indexes a folder in pytest's tmp
    with running_server(data_dir, homeai_cache_dir, env=env) as server:
        yield server


@pytest.fixture(scope="module")
def server_url(tui_server: ServerProcess) -> str:
    """Base URL of the running server."""
    return tui_server.url
