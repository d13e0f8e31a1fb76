"""Hot reload of the policy file: poll its mtime and size, apply a changed file, refuse a bad one.

Polling (every second by default) needs no dependency and works on every filesystem, bind mounts
included. A changed file is read once and goes through ``apply_policy_text`` (validated, swapped in,
its exact text kept for GET /admin/policy and stored as a version):
an invalid file is refused and logged with its key paths, and the running policy stays. A changed file is
read once it has stayed the same for ``SETTLE_S``: an editor that truncates the file and writes it in
pieces shows a half-written file meanwhile, and a half cut at a line break is often valid YAML (every
class, user and alias after the cut removed, queued requests of those classes rejected). A refused file is
validated again every ``REFUSED_RETRY_S`` (quietly) while it stays as it is: a model it names may have been
pulled since, or a file that could not be read may have been made readable (``chmod`` changes its ctime,
which the signature holds).
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

Signature = tuple[int, int, int, int] | None  # (mtime_ns, size, ctime_ns, inode); None: the file is missing
REFUSED_RETRY_S = 10.0  # a refused file is validated again this often while it stays as it is
SETTLE_S = 0.5  # a changed file is read once it has not changed for this long (an editor writing in pieces)


def file_signature(path: Path) -> Signature:
    """What tells a changed file: its content (mtime, size), its permissions and owner (ctime: a file made
    readable again) and the file itself (inode: replaced by a rename)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino)


async def settled_signature(path: Path, current: Signature, settle_s: float) -> Signature:
    """The file's signature once it has stayed the same for ``settle_s``."""
    while True:
        await asyncio.sleep(settle_s)
        again = file_signature(path)
        if again == current:
            return current
        current = again


async def check_policy_file(holder: PolicyHolder, path: Path, store: Store | None = None,
                            log_refusal: bool = True) -> bool | None:
    """Apply the file if it differs from the running text. True: applied; False: refused; None:
    nothing to do (unchanged, or missing: a deleted file keeps the running policy); a file that cannot be
    read counts as refused (False), so it is tried again."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        if log_refusal:
            log.warning("policy file %s cannot be read (%s); keeping the running policy", path, e.strerror or e)
        return False
    if text == running_text(holder):
        return None
    try:
        applied = await apply_policy_text(holder, store, text, applied_by="file", note=f"file {path.name}",
                                          source=str(path), swap_source=str(path), read_from=path)
    except PolicyError as e:
        if log_refusal:
            log.error("policy file change refused, keeping swap version %d:\n%s", holder.version, e)
        return False
    if not applied.changed:
        return None  # the file changed again (an admin apply wrote it) while this reload waited
    log.info("policy file %s reloaded: %s", path, "; ".join(applied.diff) or "no semantic change")
    return True


async def watch_policy_file(holder: PolicyHolder, path: str | Path, store: Store | None = None,
                            interval_s: float = 1.0, retry_s: float = REFUSED_RETRY_S,
                            settle_s: float = SETTLE_S) -> None:
    """Poll forever (cancel the task to stop). The first poll only takes the file's signature."""
    path = Path(path)
    seen = file_signature(path)
    refused_at: float | None = None  # when the file as it is was last refused
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        current = file_signature(path)
        # A refused file is checked again now and then, unchanged: what refused it may have been outside it
        # (a model not pulled yet, one that did not fit beside a model since unloaded); it stayed refused
        # until the next edit, while the file and the running policy disagreed (a restart would switch).
        retry = current == seen and refused_at is not None and loop.time() - refused_at >= retry_s
        if current == seen and not retry:
            continue
        if not retry and current is not None:
            current = await settled_signature(path, current, settle_s)
        seen = current
        if current is None:
            log.warning("policy file %s is gone; keeping the running policy", path)
            refused_at = None
            continue
        try:
            outcome = await check_policy_file(holder, path, store, log_refusal=not retry)
        except Exception:  # never let one bad reload kill the watcher
            log.exception("policy reload from %s failed", path)
            outcome = None
        refused_at = loop.time() if outcome is False else None


def start_policy_watcher(holder: PolicyHolder, path: str | Path, store: Store | None = None,
                         interval_s: float = 1.0, retry_s: float = REFUSED_RETRY_S,
                         settle_s: float = SETTLE_S) -> asyncio.Task[None]:
    """Start watching ``path`` on the running loop; cancel the returned task at shutdown. With a
    ``store``, every reload is recorded as a policy version applied by ``file``.

    The running policy's text is captured now (from the file, while it still matches), so that
    GET /admin/policy keeps answering it after the file is edited into something invalid.
    """
    running_text(holder)
    return asyncio.create_task(watch_policy_file(holder, path, store, interval_s, retry_s, settle_s),
                               name="homeai-policy-watcher")
