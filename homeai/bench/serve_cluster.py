"""`homeai bench serve --nodes N [--stop-node-at S]`: the serve bench against a cluster on this machine:
`homeai serve --cluster` on loopback plus N `homeai node join` processes, each a replica of the models and
each engine with its share of this machine's cores; with ``--stop-node-at``, one node is stopped (SIGTERM,
as systemd stops it) S seconds into the loaded household run: its streams that had begun end with an error
event, the others are placed again, and the report's ``lost`` must stay 0."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from homeai.bench.soak_server import _free_port, _wait_ready, stop_server

NODE_READY_TIMEOUT_S = 300.0


@dataclass
class LocalNodes:
    """The `homeai node join` processes of a bench run."""

    url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stopped_at_s: float | None = None

    def stop_first(self) -> None:
        proc = self.procs[0]
        self.stopped_at_s = time.time()
        proc.terminate()
        proc.wait(60)

    def nodes(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.url}/v1/stats", timeout=10).json().get("cluster", {}).get("nodes", []))

    def summary(self) -> dict[str, Any]:
        return {"joined": len(self.procs), "stopped_at_unix_s": self.stopped_at_s,
                "nodes": [{k: n[k] for k in ("name", "state", "served", "failed")} for n in self.nodes()]}


@contextlib.contextmanager
def launched_cluster(log: Any, num_nodes: int, env_extra: dict[str, str] | None = None,
                     ) -> Iterator[tuple[str, int, LocalNodes]]:
    """The front door (its defaults, a temporary data dir, a Ray head on a free loopback port) and
    ``num_nodes`` nodes joined to it; yields (url, server pid, nodes) once every node's replica is ready."""
    with tempfile.TemporaryDirectory(prefix="homeai-bench-cluster-") as tmp:
        port, cluster_port = _free_port(), _free_port()
        url, address = f"http://127.0.0.1:{port}", f"127.0.0.1:{cluster_port}"
        data = Path(tmp) / "data"
        # The front door and the nodes are engines on one machine: each gets its share of the cores (OpenMP
        # threads of several engines on the same cores, spinning, would measure oversubscription).
        threads = str(max(1, (os.cpu_count() or 1) // (num_nodes + 1)))
        env = {**os.environ, "HOMEAI_CPU_THREADS": threads, **(env_extra or {})}
        cmd = [sys.executable, "-m", "homeai.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", str(data), "--cluster", address]
        log(f"serve: starting {' '.join(cmd[2:])}")
        log_path = Path(tmp) / "server.log"
        with log_path.open("ab") as server_log:
            proc = subprocess.Popen(cmd, env=env, stdout=server_log, stderr=subprocess.STDOUT)
        nodes = LocalNodes(url)
        try:
            _wait_ready(proc, url, log_path)
            for i in range(num_nodes):
                node_cmd = [sys.executable, "-m", "homeai.cli.main", "node", "join", address, "--node-ip",
                            "127.0.0.1", "--name", f"node{i + 1}", "--token-file", str(data / "cluster_token")]
                with (Path(tmp) / f"node{i + 1}.log").open("ab") as node_log:
                    nodes.procs.append(subprocess.Popen(node_cmd, env=env, stdout=node_log, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + NODE_READY_TIMEOUT_S
            while sum(n["state"] == "ready" and n["name"] != "local" for n in nodes.nodes()) < num_nodes:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nodes not ready after {NODE_READY_TIMEOUT_S:.0f} s: {nodes.nodes()}")
                time.sleep(0.5)
            log(f"cluster: {num_nodes} node(s) ready beside the front door's own device")
            yield url, proc.pid, nodes
        finally:
            for node in nodes.procs:
                if node.poll() is None:
                    node.terminate()
            for node in nodes.procs:
                try:
                    node.wait(30)
                except subprocess.TimeoutExpired:
                    node.kill()
            stop_server(proc)
