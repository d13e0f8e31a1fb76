"""`homeai bench kernels` on a tiny shape: every kernel runs on the model's weight shapes and is reported."""

from __future__ import annotations

import pytest
import torch

from homeai.bench.kernel_bench import run_kernels, weight_shapes
from homeai.runtime.llama_config import LlamaConfig

TINY = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16)


def test_weight_shapes_are_one_decode_step() -> None:
    shapes = weight_shapes(TINY)
    assert shapes[:4] == [(128, 64), (64, 64), (256, 64), (64, 128)]  # qkv, o, gate_up, down
    assert len(shapes) == 2 * 4 + 1 and shapes[-1] == (96, 64)  # the lm_head last


def test_every_kernel_reported_per_row_count() -> None:
    lines: list[str] = []
    out = run_kernels(TINY, [1, 3], repeats=1, log=lines.append)
    assert set(out["rows"]) == {1, 3} and len(lines) == 2
    row = out["rows"][3]
    assert {"float32", "torch_int8pack", "bf16_dequantize"} <= set(row)
    assert ("int8_native" in row) == out["native"] and ("float32_packed" in row) == out["float32_packed"]
    assert all(v > 0 for v in row.values())
    assert out["int8_mb"] == sum(n * k for n, k in weight_shapes(TINY)) / 1e6
    assert torch.get_num_threads() == out["threads"]


def test_attention_reported_per_shape_and_cache_type() -> None:
    from homeai.bench.attention_bench import parse_shapes, run_attention
    from homeai.runtime.kernels import decode_attention

    if decode_attention() is None:
        pytest.skip("the native decode-attention kernel is not available here")
    shape = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=128, num_layers=2, num_heads=6,
                        num_kv_heads=2, head_dim=64)
    lines: list[str] = []
    out = run_attention(shape, parse_shapes("1x40,3x17"), repeats=1, log=lines.append)
    assert list(out["steps"]) == ["1x40", "3x17"] and len(lines) == 2
    step = out["steps"]["3x17"]
    assert set(step) == {"float32_ms", "float32_gb_s", "float16_ms", "float16_gb_s"}
    assert all(v > 0 for v in step.values())
    # the same rows read half the bytes from a float16 cache
    assert step["float16_gb_s"] * step["float16_ms"] * 2 == pytest.approx(step["float32_gb_s"] * step["float32_ms"])
