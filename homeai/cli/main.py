"""`homeai` console script: one argparse parser; each part registers its own subcommands."""

from __future__ import annotations

import argparse

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
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
