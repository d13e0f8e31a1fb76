"""The store on a real SQLite file: API keys (hashed, cached, revocable) and policy versions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from homeai.store.db import Store
from homeai.store.keys import KEY_PREFIX, KeyStoreError, hash_key


async def test_create_verify_revoke(store: Store) -> None:
    assert not await store.keys.has_active()
    key, info = await store.keys.create("alice-phone", user="alice", default_class="voice")
    assert key.startswith(KEY_PREFIX) and len(key) > 40 and info.prefix == key[:12]
    found = await store.keys.verify(key)
    assert found is not None and found.user == "alice" and found.default_class == "voice"
    assert not found.is_admin and await store.keys.has_active()
    assert await store.keys.verify(key + "x") is None
    assert await store.keys.verify("not-a-key") is None
    revoked = await store.keys.revoke("alice-phone")
    assert revoked.revoked_at is not None
    assert await store.keys.verify(key) is None
    assert not await store.keys.has_active()
    assert [k.name for k in await store.keys.list(include_revoked=True)] == ["alice-phone"]
    assert await store.keys.list() == []


async def test_user_defaults_to_name_and_admin_flag(store: Store) -> None:
    key, info = await store.keys.create("dad", is_admin=True)
    assert info.user == "dad" and info.is_admin
    verified = await store.keys.verify(key)
    assert verified is not None and verified.is_admin


async def test_only_the_hash_is_stored(store: Store, tmp_path: Path) -> None:
    key, _ = await store.keys.create("kitchen")
    await store.close()
    with sqlite3.connect(tmp_path / "homeai.db") as conn:
        rows = conn.execute("SELECT key_hash, prefix FROM api_keys").fetchall()
    assert rows == [(hash_key(key), key[:12])]
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("homeai.db"))
    assert key.encode() not in raw


async def test_revoke_by_prefix(store: Store) -> None:
    key1, _ = await store.keys.create("one")
    await store.keys.create("two")
    with pytest.raises(KeyStoreError, match="no active key"):
        await store.keys.revoke("three")
    with pytest.raises(KeyStoreError, match="no active key"):
        await store.keys.revoke("hai_")  # shorter than MIN_MATCH_CHARS: never a prefix match
    info = await store.keys.revoke(key1[:10])
    assert info.name == "one"
    with pytest.raises(KeyStoreError, match="no active key"):
        await store.keys.revoke(key1)  # already revoked


async def test_duplicate_active_name_refused_until_revoked(store: Store) -> None:
    await store.keys.create("tv")
    with pytest.raises(KeyStoreError, match="already named"):
        await store.keys.create("tv")
    await store.keys.revoke("tv")
    key, _ = await store.keys.create("tv")
    assert await store.keys.verify(key) is not None


async def test_cache_sees_changes_from_another_process(store: Store, tmp_path: Path) -> None:
    """A key revoked by `homeai keys revoke` (another Store on the same file) stops working after the TTL."""
    key, _ = await store.keys.create("laptop")
    now = [0.0]
    store.keys._clock = lambda: now[0]
    assert await store.keys.verify(key) is not None  # cached at t=0
    other = Store.in_dir(tmp_path)
    await other.init()
    await other.keys.revoke("laptop")
    await other.close()
    assert await store.keys.verify(key) is not None  # still cached
    now[0] += store.keys.cache_ttl_s + 0.1
    assert await store.keys.verify(key) is None


async def test_policy_versions_record_history_get(store: Store) -> None:
    pv = store.policy_versions
    assert await pv.latest() is None and await pv.count() == 0
    v1 = await pv.record("version: 1\n", "startup", "initial")
    v2 = await pv.record("version: 1\n# two\n", "alice")
    assert (v1.version, v2.version) == (1, 2)
    assert [v.version for v in await pv.history()] == [2, 1]
    got = await pv.get(1)
    assert got is not None and got.yaml_text == "version: 1\n" and got.note == "initial"
    assert got.applied_at.tzinfo is not None
    assert await pv.get(99) is None
    assert (await pv.latest()) == v2
    assert v2.summary()["applied_by"] == "alice"


async def test_ping_and_wal(store: Store, tmp_path: Path) -> None:
    assert await store.ping()
    with sqlite3.connect(tmp_path / "homeai.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    await store.close()
    assert not await store.ping()
