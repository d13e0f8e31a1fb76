"""How much memory a model takes on this device, before and after it loads.

Before: from the pulled folder's config (an LLM's layer shapes, in the weight format it would be served
in here: ``weights_format``) or its weight files (an encoder), so a policy can be refused before a load
fails or evicts anything (``ModelCatalog``). After: what the loaded engine holds (its weights and its KV
cache), which the model pool counts against the budget.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

from homeai.engine.llm_engine import LLMEngine
from homeai.policy.catalog import CatalogModel, ModelCatalog
from homeai.repository.entries import ModelEntry
from homeai.runtime.device import choose_device, parse_dtype

log = logging.getLogger(__name__)

# bytes per weight of a linear layer by served format (int8: a scale per row; int4: groups of 32 weights with
# a float16 step and minimum each)
_LINEAR_BYTES = {"int8": 1.0, "int4": 0.5 + 4 / 32}


def device_memory_bytes(device: torch.device) -> int | None:
    """The device's memory: a GPU's, or this machine's RAM (within a cgroup limit, if one is set)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            ram = min(ram, int(limit))
    except OSError:
        pass
    return int(ram)


def engine_bytes(engine: LLMEngine) -> tuple[int, int]:
    """(weights, KV cache) bytes a loaded LLM engine holds."""
    runner = engine.runner
    model = runner.model
    weights = int(model.weight_bytes()) + int(model.rope_table.numel() * model.rope_table.element_size())
    kv = runner.cache.kv
    return weights, int(kv.numel() * kv.element_size())


def estimate_weights_bytes(entry: ModelEntry, folder: Path, device: torch.device) -> int | None:
    """The weights of a pulled model as this device would serve them; None when it cannot be read."""
    try:
        stamp = max((p.stat().st_mtime_ns for p in folder.iterdir()), default=0)
    except OSError:
        return None
    return _estimate(entry.kind, entry.quantization, entry.dtype, str(folder), stamp, str(device))


@functools.lru_cache(maxsize=64)
def _estimate(kind: str, quantization: str, dtype: str, folder_name: str, stamp: int, device_name: str) -> int | None:
    folder, device = Path(folder_name), torch.device(device_name)
    try:
        if kind == "embedding":
            return sum(p.stat().st_size for p in folder.glob("*.safetensors")) or None
        return _llm_bytes(quantization, dtype, folder, device)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("cannot estimate the memory of %s: %s", folder, exc)
        return None


def _llm_bytes(quantization: str, dtype: str, folder: Path, device: torch.device) -> int:
    from homeai.runtime.llama_config import LlamaConfig
    from homeai.runtime.weights_format import choose_weights_format

    cfg = LlamaConfig.from_folder(folder)
    fmt = choose_weights_format(quantization, folder, device).quantization
    dtype_bytes = torch.empty((), dtype=parse_dtype(dtype, device)).element_size()
    h, hd = cfg.hidden_size, cfg.head_dim
    per_layer = (cfg.num_heads * hd + 2 * cfg.num_kv_heads * hd) * h + h * cfg.num_heads * hd \
        + 3 * cfg.intermediate_size * h
    linear = _LINEAR_BYTES.get(fmt, float(dtype_bytes))
    head = _LINEAR_BYTES["int8"] if fmt in ("int4", "int8") else float(dtype_bytes)  # embed / lm_head
    heads = 1 if cfg.tie_word_embeddings else 2
    rope = cfg.max_position_embeddings * (hd // 2) * 8  # complex64
    norms = (2 * cfg.num_layers + 1) * h * dtype_bytes
    return int(cfg.num_layers * per_layer * linear + heads * cfg.vocab_size * h * head + norms + rope)


def build_catalog(entries: dict[str, ModelEntry], cache_dir: Path, device: str | torch.device | None = None,
                  default_kv_cache_mb: int = 256, require_pulled: bool = True) -> ModelCatalog:
    """The repository as a policy is checked against it on this device (see ``homeai.policy.catalog``)."""
    dev = device if isinstance(device, torch.device) else choose_device(device)
    models = {}
    for name, entry in entries.items():
        pulled = entry.is_present(cache_dir)
        weights = estimate_weights_bytes(entry, entry.local_path(cache_dir), dev) if pulled else None
        models[name] = CatalogModel(name, entry.kind, pulled, weights)
    return ModelCatalog(models, device_memory_bytes(dev), default_kv_cache_mb, require_pulled, dev.type)


def free_engine(engine: LLMEngine) -> Callable[[], None]:
    """An unloaded engine: its compilation stops now; its tensors go with the last reference to it, which
    the caller holds, so what hands the pages back (glibc's arenas on the CPU, torch's cache on a GPU) is
    returned, for the caller to run once it has dropped the engine. Trimming while the caller still named
    it freed nothing: only tensors glibc had mapped on their own went back at once."""
    if engine.runner.compiled is not None:
        engine.runner.compiled.stop()
    device = engine.runner.device

    def reclaim() -> None:
        import gc

        from homeai.runtime.device import release_free_memory

        gc.collect()
        release_free_memory()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    return reclaim
