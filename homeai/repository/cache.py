"""Where pulled models live on disk.

Layout (one folder per model, built in a temp folder and renamed into place, so a folder that
exists under its own name is always complete)::

    <cache>/models/<name>/              a plain Hugging Face folder, loadable as it is
    <cache>/models/<name>/.homeai-pull.json   written last: the marker `is_present` looks for
    <cache>/models/.tmp-<name>-XXXX/    a pull in progress (removed on failure)
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HOMEAI_CACHE_DIR"
MARKER_NAME = ".homeai-pull.json"


def default_cache_dir() -> Path:
    """The cache root: env HOMEAI_CACHE_DIR, else ~/.cache/homeai (XDG-style, survives reinstalls)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "homeai"


def models_cache_dir(cache_dir: Path) -> Path:
    """The folder that holds one sub-folder per pulled model."""
    return Path(cache_dir) / "models"


def model_cache_dir(cache_dir: Path, name: str) -> Path:
    """The final (converted, loadable) folder of model `name`."""
    return models_cache_dir(cache_dir) / name


def marker_path(model_dir: Path) -> Path:
    """The marker written last by a successful pull."""
    return Path(model_dir) / MARKER_NAME
