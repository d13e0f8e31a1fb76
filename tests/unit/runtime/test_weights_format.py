"""The weight format a model serves in: int4 only where its source lost what 4 bits lose, and the CPU runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from homeai.runtime import weights_format
from homeai.runtime.weights_format import choose_weights_format

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def write_gguf(folder: Path, kind: GGMLQuantizationType) -> Path:
    """A GGUF with one decoder-layer matrix of type ``kind`` (and an F32 norm that must not count)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    data = w if kind == GGMLQuantizationType.F32 else quantize(w, kind)
    writer.add_tensor("blk.0.attn_q.weight", data, raw_dtype=kind)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.add_tensor("blk.1.ffn_up.weight", data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("kind", "expected"), [(GGMLQuantizationType.Q4_1, "int4"),
                                                (GGMLQuantizationType.Q4_0, "int4"),
                                                (GGMLQuantizationType.Q8_0, "none"),
                                                (GGMLQuantizationType.F32, "none")])
def test_auto_serves_int4_only_for_a_4_bit_source_on_the_cpu(tmp_path: Path, kind: GGMLQuantizationType,
                                                             expected: str) -> None:
    write_gguf(tmp_path, kind)
    assert choose_weights_format("auto", tmp_path, CPU).quantization == expected
    on_gpu = choose_weights_format("auto", tmp_path, CUDA)
    assert on_gpu.quantization == "none"  # the lossless next best: int8 would lose what the source kept
    if expected == "int4":
        assert "CPU only" in on_gpu.reason


def test_float_weights_and_explicit_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_weights_format("auto", tmp_path, CPU).quantization == "none"  # no GGUF: float weights
    assert choose_weights_format("int8", tmp_path, CPU).quantization == "int8"
    assert choose_weights_format("int4", tmp_path, CUDA).quantization == "int8"
    write_gguf(tmp_path, GGMLQuantizationType.Q4_1)
    monkeypatch.setattr(weights_format, "int4_available", lambda: "no int4 kernel in this build")
    fmt = choose_weights_format("auto", tmp_path, CPU)
    assert fmt.quantization == "none" and "no int4 kernel" in fmt.reason


def test_the_layer_type_is_kept_for_this_file_and_read_again_when_it_changes(tmp_path: Path) -> None:
    path = write_gguf(tmp_path, GGMLQuantizationType.Q4_1)
    assert weights_format.gguf_layer_type(path) == "Q4_1"
    assert (tmp_path / weights_format.LAYER_TYPE_FILE).is_file()
    assert weights_format.gguf_layer_type(path) == "Q4_1"  # from the kept file
    write_gguf(tmp_path, GGMLQuantizationType.Q8_0)  # the same name, another file (size or mtime differ)
    assert weights_format.gguf_layer_type(path) == "Q8_0"
