"""The shared test-server launcher keeps its promises: a server that cannot start fails the test with
its log, a port taken meanwhile moves the first start elsewhere, and stop and kill end the process."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess

pytestmark = pytest.mark.slow


def test_a_server_that_exits_fails_the_test_with_its_log(homeai_cache_dir: Path, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, homeai_cache_dir, database_url="nosuchdb://nowhere/x")
    with pytest.raises(pytest.fail.Exception) as failed:
        server.start()
    message = str(failed.value)
    assert "exited with" in message and "nosuchdb" in message, message
    assert server.proc is None


def test_a_taken_port_moves_the_first_start_and_stop_ends_the_process(
        pulled_models: dict[str, Path], homeai_cache_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = ServerProcess(tmp_path, homeai_cache_dir, port=taken)
        try:
            server.start()
            assert server.port != taken and server.num_starts == 1
            first_try = server.log_path.read_text().lower().split("--- start")[1]
            assert "address already in use" in first_try
            assert " loaded in " not in first_try, "a taken port must fail before the models load"
            assert httpx.get(f"{server.url}/readyz", timeout=30).json()["status"] == "ready"
            proc = server.proc
            assert proc is not None
            server.kill()
            assert proc.returncode == -9 and server.proc is None
            server.start()  # same port and data, like a restart after a power cut
            assert server.num_starts == 2 and httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
        finally:
            exit_code = server.stop()
    assert exit_code in (0, -15, 143), exit_code
    assert server.stop() is None
