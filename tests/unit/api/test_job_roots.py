"""Job roots: with HOMEAI_JOB_ROOTS set, an index job may read only folders inside them (what keeps a
fuzzed or mistaken job off the server's disks); unset, any folder the server can read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from homeai.api.errors import BadRequest
from homeai.api.jobs_schemas import JobCreate, job_spec
from homeai.api.settings import JOB_ROOTS_ENV, Settings, job_roots_from_env


def index_job(path: Path | str) -> JobCreate:
    return JobCreate(kind="index", path=str(path), collection="notes")


def test_roots_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(JOB_ROOTS_ENV, f"{tmp_path / 'a'}{os.pathsep}{os.pathsep}{tmp_path / 'b'}")
    assert job_roots_from_env() == (tmp_path.resolve() / "a", tmp_path.resolve() / "b")
    assert Settings().job_roots == job_roots_from_env()
    monkeypatch.delenv(JOB_ROOTS_ENV)
    assert Settings().job_roots == ()


def test_index_jobs_stay_inside_the_roots(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "notes").mkdir(parents=True)
    outside.mkdir()
    roots = (root.resolve(),)
    assert job_spec(index_job(root / "notes"), set(), roots)["path"] == str((root / "notes").resolve())
    assert job_spec(index_job(root), set(), roots)["path"] == str(root.resolve())
    for path in (outside, root / "notes" / ".." / ".." / "outside", Path("/")):
        with pytest.raises(BadRequest) as refused:
            job_spec(index_job(path), set(), roots)
        assert refused.value.param == "path"
    (root / "link").symlink_to(outside, target_is_directory=True)  # a link out of the root does not count
    with pytest.raises(BadRequest):
        job_spec(index_job(root / "link"), set(), roots)
    assert job_spec(index_job(outside), set(), ())["path"] == str(outside.resolve())  # no roots: any folder
