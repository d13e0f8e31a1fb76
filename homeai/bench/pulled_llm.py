"""The model folder a bench runs on: the entry pulled into the cache, refused unless it is an LLM."""

from __future__ import annotations

import sys
from pathlib import Path


def pulled_llm_folder(model: str, quiet: bool) -> Path | int:
    """The pulled folder, or the exit status after the reason went to stderr (1: pull, 2: not an LLM)."""
    from homeai.repository.cache import default_cache_dir
    from homeai.repository.entries import EntryError, get_entry
    from homeai.repository.pull import PullError, pull

    try:
        entry = get_entry(model)
        folder = pull(entry, default_cache_dir(), progress=not quiet)
    except (EntryError, PullError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if entry.kind != "llm":
        print(f"error: {model} is an {entry.kind} model, not an LLM", file=sys.stderr)
        return 2
    return folder
