"""`homeai serve --cluster` and `homeai node join` as a user runs them, on loopback: the node's replica
serves OpenAI SDK streams, `homeai nodes` lists both nodes, and stopping the node mid-stream loses no
request (each stream finishes or ends with an error event) while the front door goes on serving."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_launcher import free_port, running_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

MODEL = "smollm2-135m-instruct"


def _homeai(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "homeai.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _nodes(url: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = _homeai("nodes", "--url", url, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {n["name"]: n for n in json.loads(done.stdout)}


def _running_on(url: str, name: str) -> int:
    """Requests running on a node, from /v1/stats (quicker than a `homeai nodes` process while streams run)."""
    nodes = httpx.get(f"{url}/v1/stats", timeout=10).json()["cluster"]["nodes"]
    return sum(sum(n["running"].values()) for n in nodes if n["name"] == name)


def _wait_for(predicate: Any, what: str, timeout_s: float = 120.0, every_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


def _stream(client: openai.OpenAI, n: int, results: list[tuple[str, str]]) -> None:
    """One streamed chat; records ("ok", text) or ("error", message): nothing else may happen."""
    text = ""
    try:
        stream = client.chat.completions.create(model=MODEL, stream=True, max_tokens=160, temperature=0,
                                                messages=[{"role": "user", "content": f"Count slowly to {n}"}],
                                                extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        results.append(("ok", text))
    except openai.APIError as exc:
        results.append(("error", str(exc)))


def test_serve_with_a_joined_node_loses_nothing_when_the_node_stops(tmp_path: Path, homeai_cache_dir: Path,
                                                                    pulled_models: dict[str, Path]) -> None:
    address = f"127.0.0.1:{free_port()}"
    data = tmp_path / "data"
    env = {**os.environ, "HOMEAI_CACHE_DIR": str(homeai_cache_dir), "HOMEAI_CPU_THREADS": "1"}
    with running_server(data, homeai_cache_dir, env={"HOMEAI_CLUSTER": address, "HOMEAI_CPU_THREADS": "1"}) as server:
        token = data / "cluster_token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600  # the cluster's secret, readable by its owner only
        node = subprocess.Popen([sys.executable, "-m", "homeai.cli.main", "node", "join", address, "--name",
                                 "gaming-pc", "--node-ip", "127.0.0.1", "--token-file", str(token)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for(lambda: _nodes(server.url, env).get("gaming-pc", {}).get("state") == "ready", "the node")
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
            results: list[tuple[str, str]] = []
            threads = [threading.Thread(target=_stream, args=(client, n, results)) for n in range(4)]
            for t in threads:
                t.start()
            _wait_for(lambda: _running_on(server.url, "gaming-pc") > 0, "a stream on the node", 60, every_s=0.1)
            node.terminate()  # `homeai node join` leaves on SIGTERM, as systemd stops it
            node.wait(60)
            for t in threads:
                t.join(120)
            assert len(results) == 4  # every stream ended: none hangs, none is lost
            errors = [msg for kind, msg in results if kind == "error"]
            assert all("gaming-pc" in msg for msg in errors), errors
            _wait_for(lambda: _nodes(server.url, env)["gaming-pc"]["state"] == "left", "the node to show as left",
                      30)
            after: list[tuple[str, str]] = []
            _stream(client, 3, after)
            assert after[0][0] == "ok"  # the front door's own device goes on serving
            nodes = _nodes(server.url, env)
            assert nodes["local"]["state"] == "ready" and nodes["gaming-pc"]["served"] + len(errors) > 0
        finally:
            if node.poll() is None:
                node.kill()
