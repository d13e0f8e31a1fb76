"""`homeai keys create|list|revoke` on a data directory in tmp."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from homeai.cli.keys_cmds import add_keys_commands
from homeai.store.db import Store


def run(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="homeai")
    add_keys_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_create_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--data-dir", str(tmp_path)]
    assert run(["keys", "create", "alice-phone", "--user", "alice", "--class", "chat", *where]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("hai_")
    assert run(["keys", "create", "dad", "--admin", *where]) == 0
    capsys.readouterr()
    assert run(["keys", "list", *where]) == 0
    listing = capsys.readouterr().out
    assert "alice-phone" in listing and "dad" in listing and key not in listing

    async def verify() -> tuple[str, str | None] | None:
        store = Store.in_dir(tmp_path)
        await store.init()
        try:
            info = await store.keys.verify(key)
            return (info.user, info.default_class) if info else None
        finally:
            await store.close()

    assert asyncio.run(verify()) == ("alice", "chat")
    assert run(["keys", "revoke", key[:10], *where]) == 0
    assert run(["keys", "revoke", "alice-phone", *where]) == 1  # already revoked
    assert "no active key" in capsys.readouterr().err
    assert asyncio.run(verify()) is None


def test_a_key_with_the_metrics_scope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The TUI's key reads stats and /metrics without being an admin: a monitor needs no power to change
    the policy or the keys."""
    where = ["--data-dir", str(tmp_path)]
    assert run(["keys", "create", "tui", "--user", "dad", "--scope", "metrics", *where]) == 0
    key = capsys.readouterr().out.strip()
    assert run(["keys", "list", *where]) == 0
    assert "metrics" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # argparse refuses a scope nobody checks
        run(["keys", "create", "x", "--scope", "everything", *where])

    async def scopes() -> tuple[str, ...] | None:
        store = Store.in_dir(tmp_path)
        await store.init()
        try:
            info = await store.keys.verify(key)
            return info.scopes if info else None
        finally:
            await store.close()

    assert asyncio.run(scopes()) == ("metrics",)


def test_data_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMEAI_DATA_DIR", str(tmp_path / "d"))
    assert run(["keys", "create", "tv"]) == 0
    assert (tmp_path / "d" / "homeai.db").is_file()
