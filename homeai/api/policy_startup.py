"""The policy a server starts with, even when the file in the data directory is invalid.

A policy file refused while the server ran (as it should be) is still there at the next start. Refusing
to start over it would leave a household without its voice assistant until someone reads a log, so
the server starts anyway: first on the packaged default (the store is not open yet when the app is
built), then, once the store is open and before any model loads, on the newest stored version that is
still valid. The refusal is logged and kept as a ``PolicyRefusal`` in ``Services.policy_refusal``;
/readyz says "degraded" with its reason and /v1/stats carries it for the TUI, until a valid policy
is applied (a fixed file, a PUT or a rollback), which makes the fallback no longer current.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homeai.api.policy_apply import remember_text, repository_models, use_catalog
from homeai.api.settings import DEFAULT_POLICY, Settings
from homeai.policy.loader import PolicyError, parse_policy
from homeai.policy.store import PolicyHolder
from homeai.repository.cache import default_cache_dir
from homeai.repository.entries import EntryError, load_entries
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


def startup_catalog(settings: Settings) -> Collection[str] | None:
    """The repository and the device's memory as a start checks the policy against them (what is not pulled
    yet passes: ``homeai serve`` pulls the policy's models before it loads them)."""
    from homeai.gateway.footprint import build_catalog

    try:
        entries = load_entries()
    except EntryError as e:
        log.warning("cannot read the model repository to check policy models: %s", e)
        return None
    return build_catalog(entries, settings.cache_dir or default_cache_dir(), settings.device,
                         settings.kv_cache_mb, require_pulled=False)


def startup_holder(path: Path, catalog: Collection[str] | None = None) -> tuple[PolicyHolder, PolicyRefusal | None]:
    """The file's policy; if it cannot be read or is invalid, the packaged default and the refusal.
    ``catalog``: what the models are checked against (default: the repository's names)."""
    known = catalog if catalog is not None else repository_models()
    try:
        text = path.read_text(encoding="utf-8")
        holder = PolicyHolder(parse_policy(text, str(path), known), source=str(path))
        remember_text(holder, text)
        use_catalog(holder, lambda: known)
        return holder, None
    except (OSError, UnicodeDecodeError, PolicyError) as e:
        errors = e.errors if isinstance(e, PolicyError) else [("", f"cannot read file: {e}")]
        log.error("policy file %s refused at start-up; starting on a fallback policy:\n%s", path, e)
    default_text = DEFAULT_POLICY.read_text(encoding="utf-8")
    holder = PolicyHolder(parse_policy(default_text, str(DEFAULT_POLICY), known))
    remember_text(holder, default_text)
    use_catalog(holder, lambda: known)
    return holder, PolicyRefusal(str(path), list(errors), PACKAGED_DEFAULT, holder.version)


async def fall_back_to_stored(holder: PolicyHolder, store: Store, refusal: PolicyRefusal) -> None:
    """Swap in the newest stored version that still validates (call before the engine starts)."""
    known = repository_models(holder)
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
