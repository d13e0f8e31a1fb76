"""Ray's own processes on this machine, started and stopped by us: the head beside the front door
(``homeai serve --cluster HOST[:PORT]``) and a node (``homeai node join``).

Ray listens on the network, and anyone who can reach an unauthenticated Ray cluster can run code on it.
So both roles bind to the address the user names (never all interfaces), and both run with Ray's token
authentication (``RAY_AUTH_MODE=token``): the token is ``HOMEAI_CLUSTER_TOKEN``, else a file (the front
door creates ``<data dir>/cluster_token`` with mode 0600 on first start; a node reads it from
``--token-file``). The dashboard is not started.

``ray start --block`` runs in a session of its own: stopping it drains the node, and whatever is left of its
process group (raylet, GCS, workers) is killed after, so no ``ray stop`` touches other Ray processes here.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from homeai.cluster.node_spec import NAME_LABEL, label_value, node_resources

log = logging.getLogger(__name__)

TOKEN_ENV = "HOMEAI_CLUSTER_TOKEN"
TOKEN_FILE = "cluster_token"
DEFAULT_PORT = 6380


def split_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST[:PORT]`` as (host, port); ValueError naming what is wrong (``host:abc`` was ``int()``'s error)."""
    host, _, port = address.strip().rpartition(":") if ":" in address else (address.strip(), "", "")
    if not host:
        raise ValueError(f"expected HOST[:PORT], got {address!r}")
    if not port:
        return host, default_port
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST[:PORT] with a port 0-65535, got {address!r}")
    return host, int(port)


def cluster_token(data_dir: Path | None = None, token_file: Path | None = None) -> str:
    """The cluster's shared secret: the env, else ``token_file``, else the data dir's (created if absent)."""
    if token := os.environ.get(TOKEN_ENV, "").strip():
        return token
    path = token_file or (data_dir / TOKEN_FILE if data_dir is not None else None)
    if path is None:
        raise SystemExit(f"no cluster token: set {TOKEN_ENV} or pass --token-file")
    if path.exists():
        return path.read_text().strip()
    if token_file is not None:
        raise SystemExit(f"token file {path} does not exist")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    log.info("created the cluster token in %s: a node joins with --token-file pointing to a copy of it", path)
    return path.read_text().strip()


def use_token(token: str) -> None:
    """Token authentication for this process (its Ray driver) and the Ray processes it starts; call it
    before importing Ray, which reads the mode once."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    # Ray's C++ failure handler would take SIGTERM from uvicorn's graceful drain (a second one kills the process)
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")


class RayProcess:
    """``ray start ... --block`` as a child in its own process group."""

    def __init__(self, args: list[str]) -> None:
        ray_cli = Path(sys.executable).with_name("ray")
        self.proc = subprocess.Popen([str(ray_cli), "start", "--block", "--disable-usage-stats", *args],
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to ``ray start``, which drains the node and stops its processes; what is left of the
        group after ``timeout_s`` is killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


# The head declares a node dead after 3 missed health checks a second apart (Ray's default: 5 at 3 s): a
# gaming PC whose network goes is noticed within seconds, and its requests fail over.
HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}


def start_head(host: str, port: int) -> RayProcess:
    """The head beside the front door: no CPUs for tasks and no replica resource (the front door's own
    device is served in process), bound to ``host``."""
    return RayProcess(["--head", "--node-ip-address", host, "--port", str(port), "--num-cpus", "0",
                       "--include-dashboard", "false", "--system-config", json.dumps(HEALTH_CHECK)])


def start_node(address: str, node_ip: str, device: str, models: list[str], name: str) -> RayProcess:
    return RayProcess(["--address", address, "--node-ip-address", node_ip,
                       "--resources", json.dumps(node_resources(device, models)),
                       "--labels", f"{NAME_LABEL}={label_value(name)}"])


def connect(address: str, timeout_s: float = 60.0) -> None:
    """Connect this process to the cluster as its driver (retrying while the head starts)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.init(address=address, namespace="homeai", log_to_driver=False)
            return
        except (ConnectionError, RuntimeError) as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"cannot reach the cluster at {address}: {exc}") from exc
            time.sleep(0.5)
