"""Job roots: an index job may read only folders inside HOMEAI_JOB_ROOTS (what keeps a fuzzed, mistaken or
web-page-made job off the server's disks); unset, only the user's home folder, never /etc; ``*``, any."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from homeai.api.errors import BadRequest
from homeai.api.jobs_schemas import JobCreate, job_spec
from homeai.api.settings import JOB_ROOTS_ENV, Settings, default_job_roots, job_roots_from_env


def index_job(path: Path | str) -> JobCreate:
    return JobCreate(kind="index", path=str(path), collection="notes")


def test_roots_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(JOB_ROOTS_ENV, f"{tmp_path / 'a'}{os.pathsep}{os.pathsep}{tmp_path / 'b'}")
    assert job_roots_from_env() == (tmp_path.resolve() / "a", tmp_path.resolve() / "b")
    assert Settings().job_roots == job_roots_from_env()
    monkeypatch.setenv(JOB_ROOTS_ENV, "*")
    assert Settings().job_roots == (Path("/"),)


def test_unset_roots_mean_the_home_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Before: unset meant any folder, so a job could index /etc (or ~/.ssh's parent, /)."""
    monkeypatch.delenv(JOB_ROOTS_ENV, raising=False)
    home = tmp_path / "home" / "me"
    (home / "Documents").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert Settings().job_roots == (home.resolve(),)
    roots = Settings().job_roots
    assert job_spec(index_job(home / "Documents"), set(), roots)["path"] == str((home / "Documents").resolve())
    for path in ("/etc", tmp_path, "/"):
        with pytest.raises(BadRequest) as refused:
            job_spec(index_job(path), set(), roots)
        assert refused.value.param == "path" and "HOMEAI_JOB_ROOTS" in refused.value.message
    monkeypatch.setenv("HOME", "/")  # a service user whose home is / gets no default root at all
    assert default_job_roots() == ()
    with pytest.raises(BadRequest):
        job_spec(index_job("/etc"), set(), Settings().job_roots)


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
    with pytest.raises(BadRequest):  # no roots: no folder
        job_spec(index_job(outside), set(), ())
    assert job_spec(index_job(outside), set(), (Path("/"),))["path"] == str(outside.resolve())  # "*": any
