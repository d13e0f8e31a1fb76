"""Shared fixtures: the real models, pulled once through our own `pull()`.

`pulled_models` caches into HOMEAI_CACHE_DIR, by default `<repo>/.cache/homeai` (git-ignored), so a
second local test run finds both models already converted and pays nothing.
"""

from __future__ import annotations

import os

# pytest and the servers it starts share two cores: OpenMP threads sleep at once instead of the short spin
# the product uses (see homeai/__init__.py); set before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Servers the tests start serve eager steps: compiling every bucket in the background takes minutes of these
# two cores. The compiled path has tests of its own (test_compiled_decode.py, test_step_shapes.py).
os.environ.setdefault("HOMEAI_COMPILE_DECODE", "off")
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_NAMES = ("smollm2-135m-instruct", "all-minilm-l6-v2")
# Tests that empty and fill the one PostgreSQL database of HOMEAI_TEST_DATABASE_URL (store_helpers): under
# pytest-xdist they all run in one worker, one after the other, as they do without it.
DATABASE_TESTS = ("tests/integration/jobs/", "tests/unit/jobs/", "tests/unit/store/",
                  "tests/unit/search/test_matrix_cache.py")
# Tests that start a local Ray cluster (a head, nodes, their agents and ports): one cluster at a time.
RAY_TESTS = ("tests/integration/cluster/",)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups it adds
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that needs the real models (``pulled_models``, directly or through a fixture such as a
    server's) is ``slow`` even where its module forgot to say so. The ``gpu`` marker skips, saying so,
    where there is no CUDA device: the only skip the suite has. Each test joins its pytest-xdist group
    (``xdist_group_of``)."""
    for item in items:
        if "pulled_models" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason="gpu: needs a CUDA device"))


def xdist_group_of(item: pytest.Item) -> str:
    """The worker group of a test under ``pytest -n N --dist loadgroup`` (``make test``): its module, so
    that a module's fixtures (a server, a compiled model) are built once and its tests keep their order;
    every test of the shared PostgreSQL database in one group, every test of a Ray cluster in another."""
    module = item.nodeid.split("::", 1)[0]
    if module.startswith(DATABASE_TESTS):
        return "database"
    if module.startswith(RAY_TESTS):
        return "ray"
    names = vars(item.module) if isinstance(item, pytest.Function) else {}
    if any(getattr(value, "__module__", None) == "store_helpers" for value in names.values()):
        raise pytest.UsageError(f"{module} uses store_helpers' database: add it to DATABASE_TESTS in tests/conftest.py")
    return module


@pytest.fixture(scope="session")
def homeai_cache_dir() -> Path:
    """The cache the real models are pulled into (env HOMEAI_CACHE_DIR, else <repo>/.cache/homeai)."""
    env = os.environ.get("HOMEAI_CACHE_DIR")
    return Path(env).expanduser() if env else REPO_ROOT / ".cache" / "homeai"


@pytest.fixture(scope="session")
def pulled_models(homeai_cache_dir: Path) -> dict[str, Path]:
    """name -> loadable Hugging Face folder for every served model (pulled on first use)."""
    from homeai.repository.entries import get_entry
    from homeai.repository.pull import pull

    return {name: pull(get_entry(name), homeai_cache_dir, progress=False) for name in MODEL_NAMES}
