"""`homeai serve`: the gateway under uvicorn, on 127.0.0.1:8000 unless told otherwise.

One worker process on purpose: the process owns the accelerator, and every request must go through
its one batcher. On SIGTERM (or Ctrl-C) the app drains (homeai/api/drain.py) before uvicorn stops:
uvicorn's own graceful-shutdown wait is set a little longer than the drain, so that it never cancels a
stream before the drain has ended it with a final message. The process then exits with status 0, or
143 where uvicorn re-raises the signal; systemd counts both as a clean stop.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
from pathlib import Path
from types import FrameType
from typing import Any

from homeai.api.settings import (
    DATA_DIR_ENV,
    DRAIN_TIMEOUT_ENV,
    SettingError,
    Settings,
    check_database_url,
    default_data_dir,
)
from homeai.cli import arg_types
from homeai.cli.data_dir_lock import DataDirTakenError, hold_data_dir


def add_serve_command(subparsers: Any) -> None:
    """Register ``serve``; it sets ``func(args) -> int`` (the exit status)."""
    parser = subparsers.add_parser("serve", help="run the HTTP server (OpenAI- and Ollama-compatible)")
    parser.add_argument("--host", default=os.environ.get("HOMEAI_HOST", "127.0.0.1"),
                        help="address to bind (API keys are required beyond loopback); default 127.0.0.1")
    parser.add_argument("--port", type=arg_types.port, default=os.environ.get("HOMEAI_PORT", "8000"),
                        help="port; default 8000")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"where the policy and the database live (env {DATA_DIR_ENV}; "
                             "default: the user data directory)")
    parser.add_argument("--policy", type=Path, default=None,
                        help="policy file to run (default: policy.yaml in the data dir, "
                             "copied from policies/default.yaml on first start)")
    parser.add_argument("--kv-cache-mb", type=arg_types.positive_int, default=256,
                        help="KV cache size of the LLM; default 256")
    parser.add_argument("--device", type=arg_types.device, default=None,
                        help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--drain-timeout", type=arg_types.seconds, default=None, metavar="SECONDS",
                        help=f"on SIGTERM, how long running requests may go on (env {DRAIN_TIMEOUT_ENV}; "
                             "default 30)")
    parser.add_argument("--compile-decode", choices=["auto", "on", "off"], default=None,
                        help="compile decode steps with torch.compile, in the background at start "
                             "(env HOMEAI_COMPILE_DECODE; default auto: wherever torch.compile works here)")
    parser.add_argument("--cluster", type=arg_types.cluster_address, default=None, metavar="HOST[:PORT]",
                        help="also run a Ray head bound to HOST (port default 6380) and serve LLM requests on the "
                             "nodes that join it with `homeai node join` (env HOMEAI_CLUSTER; needs the cluster "
                             "extra: pip install 'homeai[cluster]')")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from homeai.api.app import create_app
    from homeai.api.drain import DRAIN_GRACE_S
    from homeai.api.http_limits import server_limits
    from homeai.api.services import services_of
    from homeai.policy.loader import PolicyError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # a bad setting in the environment: one line (under systemd a traceback repeated every restart)
        settings = Settings(host=args.host, port=args.port, data_dir=args.data_dir or default_data_dir(),
                            policy_path=args.policy, kv_cache_mb=args.kv_cache_mb, device=args.device,
                            exit_on_start_failure=True)
        if settings.database_url:
            check_database_url(settings.database_url)
    except SettingError as exc:
        print(f"error: {exc}")
        return 1
    if args.drain_timeout is not None:
        settings.drain_timeout_s = args.drain_timeout
    if args.compile_decode is not None:
        settings.compile_decode = args.compile_decode
    if args.cluster is not None:
        settings.cluster = args.cluster
    try:  # before the models load: a taken port fails at once, not after a minute of loading
        sock = listening_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"error: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}")
        return 1
    try:  # so does a data dir another server uses (held until this process ends)
        data_dir_lock = hold_data_dir(Path(settings.data_dir))
    except DataDirTakenError as exc:
        sock.close()
        print(f"error: {exc}")
        return 1
    except OSError as exc:
        sock.close()
        print(f"error: cannot prepare the data dir {settings.data_dir}: {exc.strerror or exc}")
        return 1
    try:
        app = create_app(settings)
    except PolicyError as exc:
        sock.close()
        print(f"error: {exc}")
        return 1
    except OSError as exc:  # the data dir cannot be made or written (a file in its way, no permission)
        sock.close()
        print(f"error: cannot prepare the data dir {settings.data_dir}: {exc.strerror or exc}"
              + (f" ({exc.filename})" if exc.filename else ""))
        return 1
    drain = services_of(app).drain

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, telling the app's drain the moment a stop signal arrives."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            drain.begin()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=args.log_level, workers=1,
                            timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s + DRAIN_GRACE_S),
                            **server_limits())
    DrainingServer(config).run(sockets=[sock])
    os.close(data_dir_lock)
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound as uvicorn binds one (``SO_REUSEADDR``: a restart right after a stop finds
    its port free); uvicorn listens on it once the app is built. Its protocol is named (``IPPROTO_TCP``):
    asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only on sockets that say they are TCP, and a
    connection accepted on a socket made with protocol 0 kept Nagle on, so a streamed token written
    while the client had not yet acknowledged the previous write (its delayed ACK: 40 ms on Linux) waited
    for that ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
