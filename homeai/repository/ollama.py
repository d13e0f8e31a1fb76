"""Read-only access to a household's Ollama store: manifest -> GGUF blob, used in place.

Layout (Ollama's own)::

    <store>/manifests/registry.ollama.ai/<namespace>/<name>/<tag>   JSON: layers with mediaType, digest
    <store>/blobs/sha256-<hex>                                     content-addressed files

The model layer (``application/vnd.ollama.image.model``) is a GGUF; its digest is its sha256.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

STORE_ENV = "OLLAMA_MODELS"
REGISTRY = "registry.ollama.ai"
MODEL_LAYER = "application/vnd.ollama.image.model"
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class OllamaError(LookupError):
    """The store, the manifest or its model layer is missing or malformed (the message says which)."""


@dataclass(frozen=True, slots=True)
class OllamaModel:
    """A resolved ``NAME[:TAG]``: where its GGUF blob is and what its sha256 must be."""

    name: str
    tag: str
    manifest: Path
    blob: Path
    digest: str  # hex sha256 of the blob


def default_store() -> Path:
    """OLLAMA_MODELS, else ~/.ollama/models (Ollama's own default for a user install)."""
    env = os.environ.get(STORE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


def parse_model(spec: str) -> tuple[str, str]:
    """``NAME[:TAG]`` -> (namespace/name, tag); a bare name lives in the ``library`` namespace."""
    name, _, tag = spec.partition(":")
    tag = tag or "latest"
    parts = name.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    if len(parts) != 2 or not all(_PART.match(p) for p in (*parts, tag)):
        raise OllamaError(f"not an Ollama model name: {spec!r} (want NAME[:TAG] or NAMESPACE/NAME[:TAG])")
    return "/".join(parts), tag


def resolve(spec: str, store: Path | None = None) -> OllamaModel:
    """Find ``spec``'s manifest and GGUF blob in ``store`` (read only; nothing is written there)."""
    root = Path(store) if store is not None else default_store()
    name, tag = parse_model(spec)
    manifest = root / "manifests" / REGISTRY / name / tag
    if not manifest.is_file():
        raise OllamaError(f"ollama model {spec!r}: no manifest at {manifest} (is it pulled in Ollama? "
                          f"set {STORE_ENV} for another store)")
    try:
        layers = json.loads(manifest.read_text())["layers"]
        digests = [layer["digest"] for layer in layers if layer.get("mediaType") == MODEL_LAYER]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OllamaError(f"ollama model {spec!r}: unreadable manifest {manifest}: {exc}") from exc
    if len(digests) != 1 or not re.fullmatch(r"sha256:[0-9a-f]{64}", digests[0]):
        raise OllamaError(f"ollama model {spec!r}: manifest {manifest} names no single sha256 model layer")
    digest = digests[0].removeprefix("sha256:")
    blob = root / "blobs" / f"sha256-{digest}"
    if not blob.is_file():
        raise OllamaError(f"ollama model {spec!r}: blob {blob} is missing")
    return OllamaModel(name, tag, manifest, blob, digest)
