"""The embedded store's files are its owner's alone: they hold every indexed chunk's text, the request
log and key hashes (found by a security review: the data dir was 0755 and homeai.db 0644 with the usual
umask, so another account on a shared PC read them past the collections' readers)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from homeai.api.settings import Settings
from homeai.store.db import Store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_new_data_dir_and_its_database_are_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        data = tmp_path / "data"
        Settings(data_dir=data).prepare_data_dir()
        store = Store.in_dir(data)
        await store.init()
        await store.keys.has_active()  # a connection has written: the WAL files exist
        try:
            assert _mode(data) == 0o700
            for path in data.glob("homeai.db*"):
                assert _mode(path) == 0o600, path
        finally:
            await store.close()
    finally:
        os.umask(old)


async def test_an_existing_world_readable_database_is_made_owner_only(tmp_path: Path) -> None:
    database = tmp_path / "homeai.db"
    database.touch(mode=0o644)
    database.chmod(0o644)
    store = Store.in_dir(tmp_path)
    await store.init()
    try:
        assert _mode(database) == 0o600
    finally:
        await store.close()
