"""`homeai policy validate|schema|diff`: check policy files before a server ever loads them."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection
from typing import Any

from homeai.cli import arg_types
from homeai.policy.loader import PolicyError, diff_policies, load_policy, policy_json_schema


def add_policy_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``policy`` and its subcommands on the top-level parser's subparsers.

    Each subcommand sets ``func(args) -> int`` (the exit status) on the parsed arguments.
    """
    policy = subparsers.add_parser("policy", help="validate, describe and compare policy files")
    sub = policy.add_subparsers(dest="policy_command", required=True)

    validate = sub.add_parser("validate", help="check a policy file (exit 1 with every error found)")
    validate.add_argument("file")
    validate.add_argument("--kv-cache-mb", type=arg_types.positive_int, default=256,
                          help="the server's KV cache per LLM, as `homeai serve --kv-cache-mb` (default 256)")
    validate.add_argument("--device", type=arg_types.device, default=None,
                          help="the device the server runs on (default: cuda if available)")
    validate.set_defaults(func=cmd_validate)

    schema = sub.add_parser("schema", help="print the policy JSON Schema (for editors)")
    schema.set_defaults(func=cmd_schema)

    diff = sub.add_parser("diff", help="show what changes from policy A to policy B")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.set_defaults(func=cmd_diff)
    return policy


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate as a running server would: against the model repository (a class's model must be in it and
    pulled) and this device's memory (the models it loads must fit the policy's memory budget)."""
    from homeai.gateway.footprint import build_catalog
    from homeai.repository.cache import default_cache_dir
    from homeai.repository.entries import EntryError, load_entries

    try:
        known: Collection[str] | None = build_catalog(load_entries(), default_cache_dir(),
                                                      getattr(args, "device", None), getattr(args, "kv_cache_mb", 256))
    except EntryError as e:
        print(f"warning: models not checked: {e}", file=sys.stderr)
        known = None
    try:
        policy = load_policy(args.file, known_models=known)
    except PolicyError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{args.file}: ok ({len(policy.classes)} classes, {len(policy.users)} users, "
          f"{len(policy.aliases)} aliases)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    json.dump(policy_json_schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    """Exit 0 whether or not they differ (like a report); 1 only when a file is invalid."""
    try:
        a, b = load_policy(args.a), load_policy(args.b)
    except PolicyError as e:
        print(e, file=sys.stderr)
        return 1
    lines = diff_policies(a, b)
    print("\n".join(lines) if lines else "no differences")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m homeai.cli.policy_cmds``) until the main CLI wires it in."""
    parser = argparse.ArgumentParser(prog="homeai")
    add_policy_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
