"""The model repository seen through Ollama's model endpoints: tags, show, ps and pull.

Names are repository entries (``smollm2-135m-instruct``) or the policy's aliases (``voice``), with or
without Ollama's ``:latest`` tag. Digests are the entry's source fingerprint, so they change exactly
when the weights' source does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from homeai.api.errors import BadRequest, NotFound
from homeai.api.routing import normalize_model
from homeai.gateway.gateway import Gateway
from homeai.repository.cache import default_cache_dir, marker_path
from homeai.repository.entries import ModelEntry
from homeai.repository.pull import PullError, pull

_FAMILY = {"llm": "llama", "embedding": "bert"}
_QUANT = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_pull_lock = asyncio.Lock()


def _cache_dir(gateway: Gateway) -> Path:
    return gateway.config.cache_dir or default_cache_dir()


def resolve_entry(gateway: Gateway, name: str | None) -> ModelEntry:
    """The repository entry behind a model name or alias; 404 when there is none."""
    model = normalize_model(name)
    if not model:
        raise BadRequest("model is required", param="model")
    alias = gateway.policy.aliases.get(model)
    if alias is not None:
        cls = gateway.policy.classes[alias.class_name]
        model = alias.model or cls.model
    entry = gateway.entries.get(model)
    if entry is None:
        raise NotFound(f"model {name!r} not found", param="model", code="model_not_found")
    return entry


def _folder_size(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _modified_at(gateway: Gateway, entry: ModelEntry) -> str:
    path = marker_path(entry.local_path(_cache_dir(gateway)))
    stamp = path.stat().st_mtime if path.exists() else gateway.started_s
    return datetime.fromtimestamp(stamp, UTC).isoformat().replace("+00:00", "Z")


def model_details(gateway: Gateway, name: str | None) -> dict[str, Any]:
    """One model as /api/tags lists it."""
    entry = resolve_entry(gateway, name)
    tag = normalize_model(name) or entry.name
    family = _FAMILY[entry.kind]
    return {
        "name": f"{tag}:latest", "model": f"{tag}:latest", "modified_at": _modified_at(gateway, entry),
        "size": _folder_size(entry.local_path(_cache_dir(gateway))), "digest": entry.source_fingerprint(),
        "details": {"parent_model": "", "format": "safetensors", "family": family, "families": [family],
                    "parameter_size": "", "quantization_level": _quantization_level(gateway, entry)},
    }


def _quantization_level(gateway: Gateway, entry: ModelEntry) -> str:
    """What the weights are served as: the loaded engine's format (int8, int4 or its dtype), else the
    entry's."""
    engine = gateway.llms.get(entry.name)
    quantization = engine.weights.quantization if engine is not None else entry.quantization
    if quantization == "int8":
        return "Q8_0"
    if quantization == "int4":
        return "Q4_1"
    dtype: str = entry.dtype
    if dtype == "auto":
        dtype = str(engine.runner.model.dtype).removeprefix("torch.") if engine is not None else "float32"
    return _QUANT.get(dtype, dtype.upper())


def model_tags(gateway: Gateway) -> list[dict[str, Any]]:
    """Served models first, then the policy's aliases (so an app can pick "voice" as its model)."""
    names = [*gateway.served_models(), *sorted(gateway.policy.aliases)]
    return [model_details(gateway, name) for name in dict.fromkeys(names)]


FOREVER = "2318-01-01T00:00:00Z"  # what Ollama shows for a model that never expires (keep_alive -1)


def model_ps(gateway: Gateway) -> list[dict[str, Any]]:
    """The models on the device now: the loaded LLMs (with when each leaves: its keep_alive after its last
    request; never for a pinned one) and the encoders (always loaded). ``size`` is what it holds in memory
    (weights and KV cache), ``size_vram`` the same on a GPU."""
    on_gpu = _on_gpu(gateway)
    residency = gateway.pool.snapshot() if gateway.pool is not None else {}
    out = []
    for name in gateway.served_models():
        res = residency.get(name)
        if name not in gateway.embedders and (res is None or not res["loaded"]):
            continue
        details = model_details(gateway, name)
        size = res["resident_bytes"] if res is not None else details["size"]
        expires = FOREVER if res is None or res["expires_at"] is None else \
            datetime.fromtimestamp(res["expires_at"], UTC).isoformat().replace("+00:00", "Z")
        out.append({**details, "size": size, "expires_at": expires, "size_vram": size if on_gpu else 0})
    return out


def _on_gpu(gateway: Gateway) -> bool:
    import torch

    device = gateway.config.device
    return device.startswith("cuda") if device else bool(torch.cuda.is_available())


def model_show(gateway: Gateway, name: str | None) -> dict[str, Any]:
    """Details, chat template and capabilities: an LLM completes and calls tools (``homeai.api.tools``)."""
    details = model_details(gateway, name)
    entry = resolve_entry(gateway, name)
    family = details["details"]["family"]
    template = ""
    if entry.name in gateway.llms:
        template = getattr(gateway.llms[entry.name].tokenizer, "chat_template", None) or ""
    return {
        "license": "", "modelfile": f"# served by HomeAI Gateway\nFROM {entry.name}\n", "parameters": "",
        "template": template, "details": details["details"], "modified_at": details["modified_at"],
        "model_info": {"general.architecture": family, "general.basename": entry.name,
                       f"{family}.context_length": entry.served_len},
        "capabilities": ["completion", "tools"] if entry.kind == "llm" else ["embedding"],
    }


async def pull_lines(gateway: Gateway, name: str | None) -> AsyncIterator[dict[str, Any]]:
    """Ollama's pull progress, from our repository: already-present models finish at once.

    A model pulled here is on disk but not served until the policy names it and the server restarts.
    """
    entry = resolve_entry(gateway, name)
    cache = _cache_dir(gateway)
    digest = f"sha256:{entry.source_fingerprint()}"
    yield {"status": "pulling manifest"}
    if not entry.is_present(cache):
        async with _pull_lock:
            try:
                await asyncio.to_thread(pull, entry, cache, False)
            except PullError as exc:
                yield {"error": f"pull {entry.name}: {exc}"}
                return
    size = _folder_size(entry.local_path(cache))
    yield {"status": f"pulling {digest[7:19]}", "digest": digest, "total": size, "completed": size}
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    yield {"status": "success"}
