"""`homeai pull PATH | ollama:NAME[:TAG] | hf:REPO`: a model the household already has becomes an entry.

The argument is turned into a validated ``ModelEntry`` (source and sha256 recorded) and written as
``<models>/<name>.yaml``, so the server serves it like any other entry and a later pull checks that the
file is still the one that was added. Nothing is copied: a GGUF or an Ollama blob is read in place.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from homeai.repository import ollama
from homeai.repository.entries import ModelEntry, SourceFile, find_models_dir
from homeai.repository.pull import PullError, hash_file

DEFAULT_MAX_MODEL_LEN = 2048  # served context unless the model's own is shorter (keeps the KV cache small)
HF_FOLDER_FILES = ("config.json", "*.safetensors", "tokenizer*.json", "generation_config.json",
                   "special_tokens_map.json")


def is_source_spec(arg: str) -> bool:
    """True when ``arg`` names a source rather than an entry (entry names have no ``/`` or ``:``)."""
    return arg.startswith(("ollama:", "hf:")) or "/" in arg or arg.endswith(".gguf")


def entry_name(text: str) -> str:
    """A repository name (lower case, ``[a-z0-9._-]``) made from a file or model name."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return name or "model"


def _sha256(path: Path) -> str:
    with path.open("rb") as src:
        return hash_file(src)


def _gguf_context(path: Path) -> int:
    from homeai.runtime.gguf_loader import GGUFError, open_gguf

    try:
        _, config, _ = open_gguf(path)
    except (GGUFError, ValueError, OSError) as exc:
        raise PullError(f"{path}: {exc}") from exc
    return int(config["max_position_embeddings"])


def _hf_context(folder: Path) -> int:
    import json

    from homeai.runtime.llama_config import LlamaConfig

    try:
        raw = json.loads((folder / "config.json").read_text())
        return LlamaConfig.from_hf(raw).max_position_embeddings
    except (OSError, ValueError, KeyError) as exc:
        raise PullError(f"{folder}: not a supported Hugging Face model folder: {exc}") from exc


def entry_for(spec: str, name: str | None = None, quantization: str = "auto") -> ModelEntry:
    """The entry that ``spec`` describes (files are hashed now; nothing is written)."""
    source: dict[str, Any]
    if spec.startswith("ollama:"):
        try:
            found = ollama.resolve(spec.removeprefix("ollama:"))
        except ollama.OllamaError as exc:
            raise PullError(str(exc)) from exc
        source = {"kind": "ollama", "model": spec.removeprefix("ollama:"), "digest": found.digest,
                  "store": str(ollama.default_store())}
        context = _gguf_context(found.blob)
        default_name = f"{found.name.split('/')[-1]}-{found.tag}"
    elif spec.startswith("hf:"):
        repo_id, _, revision = spec.removeprefix("hf:").partition("@")
        source = {"kind": "hf_hub", "repo_id": repo_id, "revision": revision or None}
        context = DEFAULT_MAX_MODEL_LEN  # unknown until downloaded; the served length is capped by it anyway
        default_name = repo_id.split("/")[-1]
    else:
        path = Path(spec).expanduser().resolve()
        if path.is_file() and path.suffix == ".gguf":
            source = {"kind": "gguf", "path": str(path), "sha256": _sha256(path)}
            context, default_name = _gguf_context(path), path.stem
        elif path.is_dir() and (path / "config.json").is_file():
            files = sorted({p for pattern in HF_FOLDER_FILES for p in path.glob(pattern)})
            source = {"kind": "hf_folder", "path": str(path),
                      "files": [SourceFile(path=p.name, sha256=_sha256(p)).model_dump() for p in files]}
            context, default_name = _hf_context(path), path.name
        else:
            raise PullError(f"{spec}: not a model name, a .gguf file, a Hugging Face folder (config.json), "
                            "ollama:NAME[:TAG] or hf:REPO")
    return ModelEntry.model_validate({
        "name": entry_name(name or default_name), "kind": "llm", "source": source, "context_length": context,
        "max_model_len": min(context, DEFAULT_MAX_MODEL_LEN), "quantization": quantization,
        "description": f"added by `homeai pull {spec}`"})


def entry_path(name: str, models_dir: Path | None = None) -> Path:
    """Where the entry named ``name`` is kept: ``<models>/<name>.yaml``."""
    return (Path(models_dir) if models_dir is not None else find_models_dir()) / f"{name}.yaml"


def write_entry(entry: ModelEntry, models_dir: Path | None = None) -> Path:
    """Save ``entry`` as ``<models>/<name>.yaml`` (refusing to overwrite another source's entry)."""
    path = entry_path(entry.name, models_dir)
    folder = path.parent
    data = entry.model_dump(mode="json", exclude_defaults=True)
    data["source"] = entry.source.model_dump(mode="json", exclude_none=True)
    if path.exists():
        existing = yaml.safe_load(path.read_text()) or {}
        if existing.get("source") != data["source"]:
            raise PullError(f"{path} already exists with another source; choose a name with --as NAME")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {entry.description}\n" + yaml.safe_dump(data, sort_keys=False))
    return path
