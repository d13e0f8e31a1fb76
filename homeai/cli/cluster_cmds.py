"""`homeai node join ADDRESS` (this machine's device serves the front door's cluster) and `homeai nodes`
(the nodes the front door sees, from its /v1/stats)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from homeai.cli import arg_types
from homeai.cli.jobs_cmds import DEFAULT_URL


def add_cluster_commands(subparsers: Any) -> None:
    node = subparsers.add_parser("node", help="this machine in a cluster")
    node_cmds = node.add_subparsers(dest="node_command", required=True)
    join = node_cmds.add_parser("join", help="serve the front door at ADDRESS with this machine's device "
                                             "(stays in the foreground; stopping it takes the node out)")
    join.add_argument("address", type=arg_types.cluster_address,
                      help="the front door's cluster address, HOST:PORT (its --cluster)")
    join.add_argument("--node-ip", default=None,
                      help="this machine's address on the LAN, which Ray binds to (default: the one that "
                           "reaches ADDRESS)")
    join.add_argument("--device", type=arg_types.device_name, default="cpu",
                      help="cpu, cuda:0, cuda:1 ...; default cpu")
    join.add_argument("--models", default="", help="comma-separated LLMs to serve (default: every LLM of the policy)")
    join.add_argument("--name", default=None, help="shown in `homeai nodes` and the TUI (default: the host name)")
    join.add_argument("--token-file", type=Path, default=None,
                      help="a copy of the front door's cluster_token (or env HOMEAI_CLUSTER_TOKEN)")
    join.set_defaults(func=cmd_node_join)
    nodes = subparsers.add_parser("nodes", help="the nodes of the front door's cluster, their devices and load")
    nodes.add_argument("--url", default=os.environ.get("HOMEAI_URL", DEFAULT_URL), help="the front door")
    nodes.add_argument("--key", default=os.environ.get("HOMEAI_API_KEY"), help="API key (default: $HOMEAI_API_KEY)")
    nodes.add_argument("--json", action="store_true", help="print the nodes as JSON")
    nodes.set_defaults(func=cmd_nodes)


def _local_ip_towards(address: str) -> str:
    """The address of this machine's interface that routes to ``address`` (no packet is sent)."""
    from homeai.cluster.ray_process import split_address

    host, port = split_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return str(s.getsockname()[0])


def cmd_node_join(args: argparse.Namespace) -> int:
    from homeai.cluster.ray_process import cluster_token, start_node, use_token

    try:  # a host that does not resolve, or no route to it: one line, before Ray starts
        node_ip = args.node_ip or _local_ip_towards(args.address)
    except OSError as exc:
        print(f"error: cannot find this machine's address towards {args.address}: {exc.strerror or exc} "
              "(check the address, or pass --node-ip)", file=sys.stderr)
        return 1
    use_token(cluster_token(token_file=args.token_file))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    name = args.name or socket.gethostname()
    node = start_node(args.address, node_ip, args.device, models, name)

    leaving = threading.Event()  # the handler only sets it: waiting on the process inside it would deadlock

    def leave(_sig: int, _frame: FrameType | None) -> None:
        leaving.set()

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    print(f"node {name} ({args.device}) joining {args.address}; stop with Ctrl-C or SIGTERM", flush=True)
    while node.alive() and not leaving.wait(0.5):
        pass
    node.stop()
    return 0 if leaving.is_set() else node.proc.returncode or 1


def cmd_nodes(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    try:
        response = httpx.get(args.url.rstrip("/") + "/v1/stats", headers=headers, timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise SystemExit(f"error: cannot read {args.url}/v1/stats: {e}") from None
    nodes = response.json().get("cluster", {}).get("nodes")
    if nodes is None:
        print("this front door runs no cluster (start it with `homeai serve --cluster HOST[:PORT]`)")
        return 0
    if args.json:
        print(json.dumps(nodes, indent=2))
        return 0
    print(f"{'node':<16} {'device':<8} {'state':<8} {'running':>7} {'queued':>6} {'free kv':>8} {'served':>6} "
          f"{'failed':>6}  models")
    now = time.time()
    for n in nodes:
        state = n["state"] if n["state"] != "left" else f"left {now - n['since_s']:.0f}s ago"
        print(f"{n['name']:<16} {n['device']:<8} {state:<8} {sum(n['running'].values()):>7} "
              f"{sum(n['queued'].values()):>6} {n['free_kv_tokens']:>8} {n['served']:>6} {n['failed']:>6}  "
              f"{','.join(n['models'])}")
    return 0
