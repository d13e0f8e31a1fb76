"""`homeai` console script: one argparse parser; each part registers its own subcommands."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import NoReturn

from homeai.cli.bench_cmds import add_bench_commands
from homeai.cli.chat_cmd import add_chat_command
from homeai.cli.cluster_cmds import add_cluster_commands
from homeai.cli.jobs_cmds import add_jobs_commands
from homeai.cli.keys_cmds import add_keys_commands
from homeai.cli.policy_cmds import add_policy_commands
from homeai.cli.repository_cmds import add_repository_commands
from homeai.cli.serve_cmd import add_serve_command
from homeai.cli.tui_cmd import add_tui_command


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; returns its exit status."""
    parser = argparse.ArgumentParser(prog="homeai", description="HomeAI Gateway")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_repository_commands(subparsers)
    add_policy_commands(subparsers)
    add_chat_command(subparsers)
    add_serve_command(subparsers)
    add_keys_commands(subparsers)
    add_jobs_commands(subparsers)
    add_bench_commands(subparsers)
    add_tui_command(subparsers)
    add_cluster_commands(subparsers)
    args = parser.parse_args(argv)
    compiling_before = compile_threads()
    status = int(args.func(args))
    if compile_threads() - compiling_before:
        exit_now(status)
    return status


def compile_threads() -> set[threading.Thread]:
    """Background decode compilations still running (none where no engine was built: torch stays unimported)."""
    decode_graph = sys.modules.get("homeai.runtime.decode_graph")
    return decode_graph.compile_threads() if decode_graph is not None else set()


def exit_now(status: int) -> NoReturn:
    """Leave without finalising Python: a decode bucket this command started compiling (``homeai serve``
    stopped during its first compile) would otherwise hold the exit until it is done (minutes on a CPU). The
    output is flushed first; what is still compiling is of no use to anyone."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    raise SystemExit(main())
