"""int8 weight-only quantization: the rounding bound, both kernel paths against the dense matmul, the
tied embedding, and a random-initialised decoder whose int8 logits stay close to its float32 ones."""

from __future__ import annotations

import pytest
import torch

from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama import AttentionMetadata, LlamaModel, PrefillChunk
from homeai.runtime.llama_config import LlamaConfig
from homeai.runtime.quant import (
    Int4Linear,
    Int8Linear,
    Linear,
    make_linear,
    quantize_int4,
    quantize_int8,
    quantize_q4_1,
)

CPU = torch.device("cpu")


def test_quantize_int8_rounding_bound() -> None:
    w = torch.randn(64, 96) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different magnitude
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    assert int(q.abs().max()) == 127  # each row's largest value maps to +-127
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())  # round-to-nearest: at most half a step


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 33, 64])  # every kernel: native, packed, dequantized
def test_int8_linear_matches_dense(rows: int) -> None:
    torch.manual_seed(rows)
    w, b, x = torch.randn(48, 64), torch.randn(48), torch.randn(rows, 64)
    layer = make_linear(w, b, "int8", CPU, torch.float32)
    scale_bytes = 4 if layer._native is not None else 2  # the scale the decode kernel reads
    assert isinstance(layer, Int8Linear) and layer.nbytes == 48 * 64 + 48 * scale_bytes + 48 * 4
    q, scale = quantize_int8(w)
    exact = x @ (q.float() * scale[:, None]).t() + b  # what the int8 weights mean, in float32
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 48)
    # bf16 activations and a bf16 scale: ~3 significant digits, so relative to the output's scale
    assert float((got - exact).abs().max()) <= 2e-2 * float(exact.abs().max())


def test_int8_embed_rows_are_dequantized_rows() -> None:
    w = torch.randn(100, 32)
    layer = make_linear(w, None, "int8", CPU, torch.float32)
    ids = torch.tensor([0, 7, 99, 7])
    rows = layer.embed(ids, torch.float32)
    assert rows.shape == (4, 32)
    assert float((rows - w[ids]).abs().max()) <= float(w.abs().max()) / 127  # one quantization step


def test_dense_linear_and_unknown_quantization() -> None:
    w = torch.randn(8, 4, dtype=torch.float64)
    layer = make_linear(w, None, "none", CPU, torch.bfloat16)  # not float32: never packed
    assert type(layer) is Linear and layer.weight.dtype == torch.bfloat16 and layer.nbytes == 8 * 4 * 2
    dense = make_linear(w, None, "none", CPU, torch.float32)  # plain or packed (see test_native_kernels.py)
    x = torch.randn(3, 4)
    torch.testing.assert_close(dense(x), x @ w.float().t())
    assert dense.num_weights == 32 and dense.nbytes >= 8 * 4 * 4
    with pytest.raises(ValueError, match="int3"):
        make_linear(w, None, "int3", CPU, torch.float32)


def q4_1_like(n: int, k: int) -> torch.Tensor:
    """Weights as a Q4_1 GGUF dequantizes to: per group of 32, ``d * q + m`` with q over all of 0..15 (each
    block's minimum and maximum are on its grid, as Q4_1 makes them), d and m float16 as in its blocks."""
    torch.manual_seed(n + k)
    q = torch.randint(0, 16, (n, k // 32, 32)).float()
    q[..., 0], q[..., 1] = 0, 15
    d = (torch.rand(n, k // 32, 1) * 0.01 + 1e-3).to(torch.float16).float()
    m = (torch.randn(n, k // 32, 1) * 1e-2).to(torch.float16).float()
    return (d * q + m).view(n, k)


def test_q4_1_weights_are_held_exactly() -> None:
    """A Q4_1 GGUF's weights come back bit for bit: the quantization our int4 kernel reads is Q4_1's."""
    w = q4_1_like(48, 96)
    q, dm = quantize_q4_1(w)
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    assert dm.shape == (48, 96 // 32, 2) and dm.dtype == torch.float16
    dequant = q.float().view(48, 3, 32) * dm[..., 0, None].float() + dm[..., 1, None].float()
    assert torch.equal(dequant.view(48, 96), w)


def test_torchs_int4_layout_rounds_scales_to_bfloat16() -> None:
    """Where the native kernel cannot run, torch's packed kernel serves: its scales and zeros are
    bfloat16, so it holds Q4_1 weights only to that rounding."""
    w = q4_1_like(48, 96)
    q, scales_zeros = quantize_int4(w)
    assert scales_zeros.shape == (96 // 32, 48, 2) and scales_zeros.dtype == torch.bfloat16
    scale = scales_zeros[..., 0].float().t().repeat_interleave(32, 1)
    zero = scales_zeros[..., 1].float().t().repeat_interleave(32, 1)
    dequant = (q.float() - 8) * scale + zero
    assert float((dequant - w).abs().max()) <= 2 ** -7 * float(w.abs().max())


@pytest.mark.parametrize("rows", [1, 7, 46, 130])
def test_int4_linear_matches_its_dequantized_weights(rows: int) -> None:
    torch.manual_seed(rows)
    w, b, x = q4_1_like(64, 96), torch.randn(64), torch.randn(rows, 96)
    layer = make_linear(w, b, "int4", CPU, torch.float32)
    assert isinstance(layer, Int4Linear) and layer.num_weights == 64 * 96
    assert layer.nbytes == 64 * 96 // 2 + (96 // 32) * 64 * 2 * 2 + 64 * 4  # nibbles, 16-bit d and m, bias
    got = layer(x)
    assert got.shape == (rows, 64) and got.dtype == torch.float32
    exact = x @ w.t() + b
    # int8 activations up to 64 rows on a CPU with VNNI (float32 up to 24 without), bfloat16 weights and
    # activations above
    assert float((got - exact).abs().max()) <= 2e-2 * float(exact.abs().max())


def test_int4_falls_back_to_int8_for_odd_shapes_and_stays_off_the_gpu() -> None:
    assert isinstance(make_linear(torch.randn(24, 64), None, "int4", CPU, torch.float32), Int8Linear)  # 24 % 16
    assert isinstance(make_linear(torch.randn(32, 48), None, "int4", CPU, torch.float32), Int8Linear)  # 48 % 32
    with pytest.raises(ValueError, match="CPU only"):
        make_linear(torch.randn(32, 64), None, "int4", torch.device("cuda"), torch.float32)


def tiny_weights(cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    hd, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    weights = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, cfg.hidden_size) * 0.5,
               "model.norm.weight": torch.ones(cfg.hidden_size)}
    shapes = {"self_attn.q_proj": (hd, cfg.hidden_size), "self_attn.k_proj": (kv, cfg.hidden_size),
              "self_attn.v_proj": (kv, cfg.hidden_size), "self_attn.o_proj": (cfg.hidden_size, hd),
              "mlp.gate_proj": (cfg.intermediate_size, cfg.hidden_size),
              "mlp.up_proj": (cfg.intermediate_size, cfg.hidden_size),
              "mlp.down_proj": (cfg.hidden_size, cfg.intermediate_size)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = torch.ones(cfg.hidden_size)
        weights[p + "post_attention_layernorm.weight"] = torch.ones(cfg.hidden_size)
        for name, shape in shapes.items():
            weights[p + name + ".weight"] = torch.randn(shape) / shape[1] ** 0.5
    return weights


def test_int8_decoder_logits_close_to_float() -> None:
    """A 2-layer random decoder: int8 logits within 5 % of the float logits' range, same argmax mostly."""
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True)
    weights = tiny_weights(cfg)
    dense = LlamaModel(cfg, weights, CPU, torch.float32, "none")
    int8 = LlamaModel(cfg, weights, CPU, torch.float32, "int8")
    assert int8.weight_bytes() < dense.weight_bytes() / 3
    n = 24
    rows = torch.arange(n)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(1))
    out = {}
    for name, model in (("dense", dense), ("int8", int8)):
        cache = KVCache(cfg.num_layers, 2, 16, cfg.num_kv_heads, cfg.head_dim, CPU, torch.float32)
        meta = AttentionMetadata(slot_mapping=rows, prefills=[PrefillChunk(0, n, None, None)])
        out[name] = model(ids, rows, meta, cache, rows)
    spread = float(out["dense"].max() - out["dense"].min())
    assert float((out["int8"] - out["dense"]).abs().max()) <= 0.05 * spread
    assert float((out["int8"].argmax(-1) == out["dense"].argmax(-1)).float().mean()) >= 0.9

