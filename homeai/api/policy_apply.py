"""Applying policy text: validate, swap atomically, remember the YAML, record the version.

The running Policy is a validated model; people edit YAML with comments. So next to each holder we
keep the exact text that was last applied (``running_text``), and each applied text is stored as a
version (who, when, why). Admin PUTs, rollbacks and file hot-reloads all come through
``apply_policy_text``, one at a time per holder; ``check_policy_text`` is the same validation as a dry
run (``POST /admin/policy/validate``), which changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from homeai.policy.loader import diff_policies, parse_policy
from homeai.policy.schema import Policy
from homeai.policy.store import PolicyHolder
from homeai.repository.entries import EntryError, load_entries
from homeai.store.db import Store

log = logging.getLogger(__name__)

_texts: weakref.WeakKeyDictionary[PolicyHolder, tuple[int, str]] = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[PolicyHolder, asyncio.Lock] = weakref.WeakKeyDictionary()


@dataclass(slots=True)
class Applied:
    """What an apply did: the diff, the holder's swap version, the stored version (None if not stored)."""

    changed: bool
    diff: list[str] = field(default_factory=list)
    swap_version: int = 0
    stored_version: int | None = None
    warning: str | None = None
    written_to: str | None = None


@dataclass(slots=True)
class Checked:
    """What applying would do: the validated policy, whether the running text would change (as
    ``Applied.changed``: a comment-only edit changes the text, with an empty diff) and the diff."""

    policy: Policy
    changed: bool
    diff: list[str]


_catalogs: weakref.WeakKeyDictionary[PolicyHolder, Callable[[], Collection[str] | None]] = \
    weakref.WeakKeyDictionary()


def use_catalog(holder: PolicyHolder, source: Callable[[], Collection[str] | None]) -> None:
    """Check the holder's new policies against ``source()``: the running gateway's ``ModelCatalog`` (what
    is pulled, what fits its memory budget), or the one a start builds before the gateway runs."""
    _catalogs[holder] = source


def repository_models(holder: PolicyHolder | None = None) -> Collection[str] | None:
    """What a class's ``model`` is checked against: the catalog registered for ``holder`` (``use_catalog``),
    else the model repository's names (None: no repository to check against, and the gateway reports a
    missing model when it loads)."""
    source = _catalogs.get(holder) if holder is not None else None
    if source is not None:
        return source()
    try:
        return frozenset(load_entries())
    except EntryError as e:
        log.warning("cannot read the model repository to check policy models: %s", e)
        return None


def remember_text(holder: PolicyHolder, text: str) -> None:
    """Record that ``text`` is the source of the holder's current policy."""
    _texts[holder] = (holder.version, text)


def running_text(holder: PolicyHolder) -> str:
    """The YAML of the running policy: the text last applied; else the holder's source file if it
    still parses to the running policy; else the policy written out as YAML (comments lost)."""
    known = _texts.get(holder)
    if known is not None and known[0] == holder.version:
        return known[1]
    source = holder.source
    if source and Path(source).is_file():
        try:
            text = Path(source).read_text(encoding="utf-8")
            if parse_policy(text, source) == holder.current:
                remember_text(holder, text)
                return text
        except Exception:  # unreadable or no longer valid: fall through to the dump
            log.debug("policy source %s does not match the running policy", source)
    data = holder.current.model_dump(mode="json", by_alias=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def policy_lock(holder: PolicyHolder) -> asyncio.Lock:
    lock = _locks.get(holder)
    if lock is None:
        lock = _locks[holder] = asyncio.Lock()
    return lock


async def record_running_policy(holder: PolicyHolder, store: Store | None, applied_by: str = "startup",
                                note: str = "running policy") -> int | None:
    """Store the running text as a version unless the latest stored version already is that text
    (call at startup, so that the first change can be rolled back). Returns the stored version."""
    if store is None:
        return None
    text = running_text(holder)
    latest = await store.policy_versions.latest()
    if latest is not None and latest.yaml_text == text:
        return latest.version
    return (await store.policy_versions.record(text, applied_by, note)).version


def check_policy_text(holder: PolicyHolder, text: str, source: str = "<admin>") -> Checked:
    """Validate ``text`` exactly as ``apply_policy_text`` does (PolicyError with key paths and lines if
    invalid) and compare it with the running policy; swaps, stores and writes nothing."""
    policy = parse_policy(text, source, repository_models(holder))
    return Checked(policy, text != running_text(holder), diff_policies(holder.current, policy))


class StalePolicyError(RuntimeError):
    """The edit was made on a policy that is no longer the running one (HTTP 412)."""

    def __init__(self, based_on: int, running: int) -> None:
        super().__init__(f"the running policy changed since it was read (swap {running}, the edit was made on "
                         f"swap {based_on}): load it again and apply the change to it")
        self.running = running


async def apply_policy_text(holder: PolicyHolder, store: Store | None, text: str, applied_by: str,
                            note: str = "", source: str = "<admin>", swap_source: str | None = None,
                            persist_to: Path | None = None, read_from: Path | None = None,
                            based_on: int | None = None) -> Applied:
    """Validate ``text`` (PolicyError with key paths if invalid: nothing changes), swap it in and
    record it; with ``persist_to``, also write it there (atomically) so that a restart keeps it.
    Text identical to the running one is a no-op, unless ``persist_to`` holds something else (then it is
    applied again and written: the way out of a fallback); a comment-only edit is applied (its text becomes
    the running text) with an empty diff. ``read_from``: the file ``text`` was read from (the
    watcher's reload), applied only if the file still holds it once the lock is ours: an admin apply
    writes the file under the same lock, so a read from before that write is stale and must not undo it.
    ``based_on``: the swap version the edit was made on (an ``If-Match``); StalePolicyError if another change
    came since, which the edit would silently undo."""
    policy = parse_policy(text, source, repository_models(holder))
    async with policy_lock(holder):
        if based_on is not None and based_on != holder.version:
            raise StalePolicyError(based_on, holder.version)
        stale_read = read_from is not None and _read_or_none(read_from) != text
        # The running text again, where the file holds something else (a server on its fallback after an
        # invalid file, a refused edit): applied and written, so the file is whole and the fallback over.
        file_differs = persist_to is not None and _read_or_none(persist_to) != text
        if stale_read or (text == running_text(holder) and not file_differs):
            return Applied(changed=False, swap_version=holder.version)
        warning = None
        try:
            await record_running_policy(holder, store, "system", "running policy before a change")
        except Exception as e:
            warning = f"policy history unavailable: {e}"
        diff = diff_policies(holder.current, policy)
        swap_version = holder.swap(policy, source=swap_source)
        remember_text(holder, text)
        stored = None
        if store is not None and warning is None:
            try:
                stored = (await store.policy_versions.record(text, applied_by, note)).version
            except Exception as e:
                warning = f"applied but not stored in the policy history: {e}"
        written_to = None
        if persist_to is not None:
            try:
                write_atomically(persist_to, text)
                written_to = str(persist_to)
            except OSError as e:
                warning = f"applied but not written to {persist_to}: {e}"
        if warning:
            log.warning("%s", warning)
        log.info("policy applied by %s (swap %d, stored %s): %s", applied_by, swap_version, stored,
                 "; ".join(diff) or "no semantic change")
        return Applied(True, diff, swap_version, stored, warning, written_to)


def _read_or_none(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def write_atomically(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: the watcher never reads half a policy."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
