"""The policy a server starts with, even when the file in the data directory is invalid.

A policy file refused while the server ran (as it should be) is still there at the next start. Refusing
to start over it would leave a household without its voice assistant until someone reads a log, so
the server starts anyway: first on the packaged default (the store is not open yet when the app is
built), then, once the store is open and before any model loads, on the newest stored version that is
still valid. The refusal is logged and kept as a ``PolicyRefusal`` in ``app.state.policy_refusal``;
/readyz says "degraded" with its reason and /v1/stats carries it for the TUI, until a valid policy
is applied (a fixed file, a PUT or a rollback), which makes the fallback no longer current.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homeai.api.policy_apply import remember_text, repository_models
from homeai.api.settings import DEFAULT_POLICY
from homeai.policy.loader import PolicyError, parse_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

log = logging.getLogger(__name__)

MAX_STORED_TRIED = 50  # stored versions tried, newest first, for one that still validates
PACKAGED_DEFAULT = "the packaged default policy"


@dataclass(slots=True)
class PolicyRefusal:
    """The policy file refused at start-up and what runs instead (while ``swap_version`` is current)."""

    path: str
    errors: list[tuple[str, str]]
    running: str
    swap_version: int

    def is_current(self, holder: PolicyHolder) -> bool:
        """Still running the fallback: no valid policy has been applied since."""
        return holder.version == self.swap_version

    @property
    def reason(self) -> str:
        first = "; ".join(f"{path or 'file'}: {msg}" for path, msg in self.errors[:3])
        more = f" (+{len(self.errors) - 3} more)" if len(self.errors) > 3 else ""
        return f"policy file {self.path} is invalid ({first}{more}); running {self.running}"

    def as_dict(self) -> dict[str, Any]:
        return {"status": "fallback", "reason": self.reason, "file": self.path, "running": self.running,
                "errors": [{"path": path, "message": msg} for path, msg in self.errors]}


def startup_holder(path: Path) -> tuple[PolicyHolder, PolicyRefusal | None]:
    """The file's policy; if it cannot be read or is invalid, the packaged default and the refusal."""
    known = repository_models()
    try:
        text = path.read_text(encoding="utf-8")
        holder = PolicyHolder(parse_policy(text, str(path), known), source=str(path))
        remember_text(holder, text)
        return holder, None
    except (OSError, UnicodeDecodeError, PolicyError) as e:
        errors = e.errors if isinstance(e, PolicyError) else [("", f"cannot read file: {e}")]
        log.error("policy file %s refused at start-up; starting on a fallback policy:\n%s", path, e)
    default_text = DEFAULT_POLICY.read_text(encoding="utf-8")
    holder = PolicyHolder(parse_policy(default_text, str(DEFAULT_POLICY), known))
    remember_text(holder, default_text)
    return holder, PolicyRefusal(str(path), list(errors), PACKAGED_DEFAULT, holder.version)


async def fall_back_to_stored(holder: PolicyHolder, store: Store, refusal: PolicyRefusal) -> None:
    """Swap in the newest stored version that still validates (call before the engine starts)."""
    known = repository_models()
    for stored in await store.policy_versions.history(MAX_STORED_TRIED):
        try:
            policy = parse_policy(stored.yaml_text, f"policy version {stored.version}", known)
        except PolicyError:
            continue
        holder.swap(policy)
        remember_text(holder, stored.yaml_text)
        refusal.running = f"stored policy version {stored.version}"
        refusal.swap_version = holder.version
        break
    log.warning("%s", refusal.reason)
