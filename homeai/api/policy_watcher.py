"""Hot reload of the policy file: poll its mtime and size, apply a changed file, refuse a bad one.

Polling (every second by default) needs no dependency and works on every filesystem, bind mounts
included. A changed file is read once and goes through ``apply_policy_text`` (validated, swapped in,
its exact text kept for GET /admin/policy and stored as a version):
an invalid file is refused and logged with its key paths, and the running policy stays. Editors
that write in two steps may show a half-written file: it is refused, and the next write applies.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from homeai.api.policy_apply import apply_policy_text, running_text
from homeai.policy.loader import PolicyError
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

log = logging.getLogger(__name__)

Signature = tuple[int, int] | None  # (mtime_ns, size); None: the file is missing


def file_signature(path: Path) -> Signature:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


async def check_policy_file(holder: PolicyHolder, path: Path, store: Store | None = None) -> bool | None:
    """Apply the file if it differs from the running text. True: applied; False: refused; None:
    nothing to do (unchanged, or missing: a deleted file keeps the running policy)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        log.warning("policy file %s cannot be read (%s); keeping the running policy", path, e.strerror or e)
        return None
    if text == running_text(holder):
        return None
    try:
        applied = await apply_policy_text(holder, store, text, applied_by="file", note=f"file {path.name}",
                                          source=str(path), swap_source=str(path), read_from=path)
    except PolicyError as e:
        log.error("policy file change refused, keeping swap version %d:\n%s", holder.version, e)
        return False
    if not applied.changed:
        return None  # the file changed again (an admin apply wrote it) while this reload waited
    log.info("policy file %s reloaded: %s", path, "; ".join(applied.diff) or "no semantic change")
    return True


async def watch_policy_file(holder: PolicyHolder, path: str | Path, store: Store | None = None,
                            interval_s: float = 1.0) -> None:
    """Poll forever (cancel the task to stop). The first poll only takes the file's signature."""
    path = Path(path)
    seen = file_signature(path)
    while True:
        await asyncio.sleep(interval_s)
        current = file_signature(path)
        if current == seen:
            continue
        seen = current
        if current is None:
            log.warning("policy file %s is gone; keeping the running policy", path)
            continue
        try:
            await check_policy_file(holder, path, store)
        except Exception:  # never let one bad reload kill the watcher
            log.exception("policy reload from %s failed", path)


def start_policy_watcher(holder: PolicyHolder, path: str | Path, store: Store | None = None,
                         interval_s: float = 1.0) -> asyncio.Task[None]:
    """Start watching ``path`` on the running loop; cancel the returned task at shutdown. With a
    ``store``, every reload is recorded as a policy version applied by ``file``.

    The running policy's text is captured now (from the file, while it still matches), so that
    GET /admin/policy keeps answering it after the file is edited into something invalid.
    """
    running_text(holder)
    return asyncio.create_task(watch_policy_file(holder, path, store, interval_s), name="homeai-policy-watcher")
