"""`homeai serve` with a model whose weights are damaged ends with one line that names the model and the
way out, and exit status 1: uvicorn's lifespan traceback (an exception group of ~60 lines) repeated at
every systemd restart before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from homeai.repository.cache import MARKER_NAME
from homeai.repository.entries import weights_sizes

pytestmark = pytest.mark.slow
LLM = "smollm2-135m-instruct"


def test_a_damaged_model_ends_the_start_with_one_line(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                       tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    for name, folder in pulled_models.items():
        if name != LLM:
            (cache / "models" / name).symlink_to(folder)
    broken = cache / "models" / LLM
    broken.mkdir()
    for item in pulled_models[LLM].iterdir():  # the folder as pulled, its converted weights zeros of their
        if item.suffix == ".safetensors":  # size (sparse): still "present" (sizes as recorded), and unreadable
            with (broken / item.name).open("wb") as damaged:
                damaged.truncate(item.stat().st_size)
        elif item.suffix == ".gguf":
            (broken / item.name).symlink_to(item)
        elif item.is_file():
            shutil.copy(item, broken / item.name)
    marker = json.loads((broken / MARKER_NAME).read_text())  # as a pull of this version writes it (sizes recorded)
    (broken / MARKER_NAME).write_text(json.dumps({**marker, "weights": weights_sizes(pulled_models[LLM])}))
    if (homeai_cache_dir / "kernels").exists():
        (cache / "kernels").symlink_to(homeai_cache_dir / "kernels")
    env = {**os.environ, "HOMEAI_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-m", "homeai.cli.main", "serve", "--port", "0", "--data-dir",
                           str(tmp_path / "data")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: cannot start")]
    assert len(lines) == 1 and LLM in lines[0] and "homeai pull --force" in lines[0], done.stderr[-2000:]
    assert "Exception Group" not in done.stderr and "Application startup failed" not in done.stderr
