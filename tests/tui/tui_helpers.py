"""Test helpers: a stand-in GatewayClient replaying recorded server answers (deterministic snapshots), and
a real `homeai serve` on loopback for the Pilot tests.

The stats documents in ``fixtures/stats.json`` were recorded from a real server under a household load
(``fixtures/record_stats.py``); the 422 body in ``fixtures/policy_422.json`` is a real server's answer to
``fixtures/policy_invalid.yaml``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tui.client import ApiError, Connection, GatewayClient

FIXTURES = Path(__file__).with_name("fixtures")


def recorded_stats() -> list[dict[str, Any]]:
    return json.loads((FIXTURES / "stats.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


class ReplayClient(GatewayClient):
    """Streams the recorded documents once (then stays connected, silent); answers the policy calls
    from fixtures. ``put_policy`` answers the recorded 422 for the recorded invalid text."""

    def __init__(self, docs: list[dict[str, Any]] | None = None) -> None:
        super().__init__("http://homeai.local:8000")
        self.docs = recorded_stats() if docs is None else docs
        self.policy_text = (FIXTURES / "policy.yaml").read_text(encoding="utf-8")
        self.invalid_text = (FIXTURES / "policy_invalid.yaml").read_text(encoding="utf-8")
        self.put_texts: list[str] = []

    async def stats_events(self) -> AsyncIterator[dict[str, Any] | Connection]:
        yield Connection(True, "live")
        for doc in self.docs:
            yield doc
        await asyncio.Event().wait()  # a quiet but open stream

    async def get_policy(self) -> str:
        return self.policy_text

    async def validate_policy(self, text: str) -> dict[str, Any] | None:
        return None

    async def put_policy(self, text: str) -> dict[str, Any]:
        self.put_texts.append(text)
        if text == self.invalid_text:
            body = json.loads((FIXTURES / "policy_422.json").read_text(encoding="utf-8"))["error"]
            raise ApiError(422, body["message"], body["errors"])
        return {"changed": text != self.policy_text, "diff": [], "version": 2}

    async def policy_history(self, limit: int = 50) -> dict[str, Any]:
        return {"current": 1, "versions": [{"version": 1, "applied_at": "2026-01-01T08:00:00+00:00",
                                            "applied_by": "startup", "note": "running policy"}]}

    async def list_jobs(self) -> list[dict[str, Any]]:
        return []


# ---- a real server on loopback ------------------------------------------------------------------------
START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_unavailable() -> str | None:
    """None when `homeai serve` can run here, else why not (the Pilot tests skip with it)."""
    if importlib.util.find_spec("homeai.cli.serve_cmd") is None or importlib.util.find_spec("homeai.api.app") is None:
        return "`homeai serve` does not exist yet (no homeai.cli.serve_cmd / homeai.api.app)"
    done = subprocess.run([sys.executable, "-m", "homeai.cli.main", "serve", "--help"], capture_output=True)
    if done.returncode != 0:
        return f"`homeai serve --help` failed: {done.stderr.decode(errors='replace')[-500:]}"
    return None


class LoopbackServer:
    """`homeai serve --port PORT` as a subprocess with its own data dir; can stop and start again on
    the same port (what a restart looks like to the TUI)."""

    def __init__(self, data_dir: Path, cache_dir: Path, port: int | None = None) -> None:
        self.data_dir, self.cache_dir = data_dir, cache_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "HOMEAI_DATA_DIR": str(self.data_dir), "HOMEAI_CACHE_DIR": str(self.cache_dir)}
        cmd = [sys.executable, "-m", "homeai.cli.main", "serve", "--port", str(self.port), "--log-level", "warning"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _wait_ready(self) -> None:
        """/healthz answers, then /readyz says the models are loaded."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        pytest.fail(f"server not ready after {START_TIMEOUT_S:.0f} s:\n{self.log_path.read_text()[-4000:]}")
