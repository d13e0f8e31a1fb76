"""`homeai keys create|list|revoke`: API keys, straight on the database of a data directory.

Works whether or not the server runs: a running server sees a new or revoked key within a few
seconds (its key cache expires). The data directory is ``--data-dir``, else HOMEAI_DATA_DIR, else
the platform's user data directory (the same default as ``homeai serve``); ``--database-url`` (or
HOMEAI_DATABASE_URL) points at another database instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from homeai.api.settings import POLICY_FILE_NAME, default_data_dir
from homeai.store.db import Store
from homeai.store.keys import KNOWN_SCOPES, KeyInfo, KeyStoreError

DATABASE_URL_ENV = "HOMEAI_DATABASE_URL"


def add_keys_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``keys`` and its subcommands; each sets ``func(args) -> int`` (the exit status)."""
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--data-dir", type=Path, default=None,
                       help="data directory (default: HOMEAI_DATA_DIR or the user data directory)")
    where.add_argument("--database-url", default=os.environ.get(DATABASE_URL_ENV),
                       help=f"SQLAlchemy async URL instead of <data-dir>/homeai.db (env {DATABASE_URL_ENV})")

    keys = subparsers.add_parser("keys", help="create, list and revoke API keys")
    sub = keys.add_subparsers(dest="keys_command", required=True)

    create = sub.add_parser("create", parents=[where], help="make a key (printed once, stored hashed)")
    create.add_argument("name", help="a name to tell the key apart (e.g. alice-phone)")
    create.add_argument("--user", help="the household member the key belongs to (default: NAME)")
    create.add_argument("--class", dest="default_class", help="class used when a request names none")
    create.add_argument("--admin", action="store_true", help="may use /admin (policy changes)")
    create.add_argument("--scope", dest="scopes", action="append", default=[], choices=sorted(KNOWN_SCOPES),
                        help="an extra permission (metrics: read /v1/stats and /metrics); repeatable")
    create.set_defaults(func=cmd_create)

    listing = sub.add_parser("list", parents=[where], help="list keys (never the keys themselves)")
    listing.add_argument("--all", action="store_true", help="include revoked keys")
    listing.set_defaults(func=cmd_list)

    revoke = sub.add_parser("revoke", parents=[where], help="revoke a key by name or by its first characters")
    revoke.add_argument("name_or_prefix")
    revoke.set_defaults(func=cmd_revoke)
    return keys


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()


def _run(args: argparse.Namespace, action: Callable[[Store], Awaitable[int]]) -> int:
    async def go() -> int:
        store = Store(args.database_url) if args.database_url else Store.in_dir(_data_dir(args))
        await store.init()
        try:
            return await action(store)
        except KeyStoreError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except (OSError, SQLAlchemyError) as e:  # a data dir under a file, a database URL nobody serves
        print(f"error: cannot open the key store: {e}", file=sys.stderr)
        return 1


def _warn_unknown_class(args: argparse.Namespace) -> None:
    """A default class the data directory's policy does not have is allowed (the policy may change),
    but almost always a typo."""
    path = _data_dir(args) / POLICY_FILE_NAME
    if not args.default_class or not path.is_file():
        return
    from homeai.policy.loader import PolicyError, load_policy

    try:
        classes = load_policy(path).classes
    except PolicyError:
        return
    if args.default_class not in classes:
        print(f"warning: {path} has no class {args.default_class!r} (classes: {', '.join(sorted(classes))})",
              file=sys.stderr)


def cmd_create(args: argparse.Namespace) -> int:
    _warn_unknown_class(args)

    async def action(store: Store) -> int:
        key, info = await store.keys.create(args.name, user=args.user, default_class=args.default_class,
                                            is_admin=args.admin, scopes=args.scopes)
        print(key)
        print(f"key {info.name!r} for user {info.user!r}" + (f", class {info.default_class}" if info.default_class
              else "") + (", admin" if info.is_admin else "")
              + "".join(f", {scope}" for scope in info.scopes) + ": shown once, only its hash is stored",
              file=sys.stderr)
        return 0

    return _run(args, action)


def _rows(keys: list[KeyInfo], with_revoked: bool) -> list[tuple[str, ...]]:
    header = ("NAME", "PREFIX", "USER", "CLASS", "ADMIN", "SCOPES", "CREATED") + (("REVOKED",) if with_revoked else ())
    rows = [header]
    for k in keys:
        row: tuple[str, ...] = (k.name, k.prefix + "…", k.user, k.default_class or "-",
                                "yes" if k.is_admin else "no", ",".join(k.scopes) or "-",
                                k.created_at.strftime("%Y-%m-%d %H:%M"))
        if with_revoked:
            row += (k.revoked_at.strftime("%Y-%m-%d %H:%M") if k.revoked_at else "-",)
        rows.append(row)
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    async def action(store: Store) -> int:
        keys = await store.keys.list(include_revoked=args.all)
        if not keys:
            print("no keys (the server is open on loopback and closed elsewhere)")
            return 0
        rows = _rows(keys, args.all)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
        return 0

    return _run(args, action)


def cmd_revoke(args: argparse.Namespace) -> int:
    async def action(store: Store) -> int:
        info = await store.keys.revoke(args.name_or_prefix)
        print(f"revoked {info.name!r} ({info.prefix}…, user {info.user!r})")
        return 0

    return _run(args, action)
