"""The fused elementwise ops of eager steps (``layer_glue.cpp``) against the torch ops they replace: every
row count from one to past the parallel grain, widths that are not a multiple of 16 (masked tails),
extreme values for the exponential, and the in-place effects (the residual lands in x, RoPE rotates only
the heads it is told). Then a whole eager forward with them against the same forward on torch's ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from homeai.runtime import kernels

needs_avx512 = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                                  reason="the fused ops are built for AVX-512 CPUs only")


@pytest.fixture(scope="module")
def glue() -> kernels.LayerGlue:
    ops = kernels.layer_glue()
    assert ops is not None, "the native kernels did not build (is a C++ compiler installed?)"
    return ops


@needs_avx512
@pytest.mark.parametrize("rows", [1, 3, 17, 64, 300])
@pytest.mark.parametrize("width", [576, 100, 16])
def test_add_rms_norm_matches_torch_and_adds_in_place(glue: kernels.LayerGlue, rows: int, width: int) -> None:
    gen = torch.Generator().manual_seed(rows * width)
    x, delta, w = torch.randn(rows, width, generator=gen), torch.randn(rows, width, generator=gen), \
        torch.randn(width, generator=gen)
    want_x = x + delta
    want = F.rms_norm(want_x, (width,), w, 1e-5)
    got = glue.add_rms_norm(x, delta, w, 1e-5)
    torch.testing.assert_close(x, want_x, rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    before = x.clone()
    torch.testing.assert_close(glue.add_rms_norm(x, None, w, 1e-5), F.rms_norm(before, (width,), w, 1e-5),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(x, before)  # no delta: x unchanged


@needs_avx512
@pytest.mark.parametrize("rows", [1, 5, 40, 300])
@pytest.mark.parametrize("inner", [1536, 40])
def test_silu_mul_matches_torch(glue: kernels.LayerGlue, rows: int, inner: int) -> None:
    gen = torch.Generator().manual_seed(rows + inner)
    gate_up = torch.randn(rows, 2 * inner, generator=gen) * 4
    gate_up[0, :8] = torch.tensor([0.0, -0.0, 30.0, -30.0, 88.0, -88.0, 200.0, -200.0])  # the exp's clamps
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(glue.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


@needs_avx512
@pytest.mark.parametrize("rows", [1, 7, 90])
def test_rope_rotates_the_named_heads_in_place_as_the_complex_multiply(glue: kernels.LayerGlue, rows: int) -> None:
    d, heads, rest = 64, 12, 3 * 64  # q and k heads rotated, v heads after them left alone
    gen = torch.Generator().manual_seed(rows)
    freqs = torch.outer(torch.arange(4096, dtype=torch.float32), 1.0 / 10000 ** (torch.arange(0, d, 2) / d))
    table = torch.polar(torch.ones_like(freqs), freqs)  # complex64 [P, d/2]
    x = torch.randn(rows, heads * d + rest, generator=gen)
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    want = x.clone()
    qk = torch.view_as_complex(want[:, :heads * d].reshape(rows, heads, d // 2, 2)) * table[positions].unsqueeze(1)
    want[:, :heads * d] = torch.view_as_real(qk).reshape(rows, heads * d)
    glue.rope_(x, positions, torch.view_as_real(table), heads)
    torch.testing.assert_close(x, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="position out of the table"):
        glue.rope_(x, torch.full((rows,), 4096), torch.view_as_real(table), heads)


@needs_avx512
@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_an_eager_step_with_the_fused_ops_matches_torchs_ops(glue: kernels.LayerGlue, quantization: str) -> None:
    """A whole forward (a prompt chunk with earlier context and a decode row beside it), through the model's
    eager path with the glue and with it switched off."""
    from homeai.bench.speed_bench import RandomWeights
    from homeai.runtime.kv_cache import KVCache
    from homeai.runtime.llama import AttentionMetadata, LlamaModel, PrefillChunk
    from homeai.runtime.llama_config import LlamaConfig

    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                      max_position_embeddings=256, tie_word_embeddings=True)
    model = LlamaModel(cfg, RandomWeights(cfg), torch.device("cpu"), torch.float32, quantization)
    assert model.glue is not None
    # On a CPU with AMX quantized models' prompts attend in bfloat16, whose rounding turns the glue's last-bit
    # differences into ~1e-3 ones: attend in float32 here, so that only the glue is compared.
    model.prompt_attention_dtype = torch.float32
    bs, blocks = 16, 8
    ids = torch.randint(1, 512, (20,), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(20)
    slots = torch.arange(20)
    ctx = torch.arange(20)
    mask = torch.ones(20, 20, dtype=torch.bool).tril()
    outs = []
    for glue_on in (True, False):
        model.glue = glue if glue_on else None
        cache = KVCache(cfg.num_layers, blocks, bs, cfg.num_kv_heads, cfg.head_dim, model.device, model.kv_dtype)
        meta = AttentionMetadata(slot_mapping=slots, prefills=[PrefillChunk(0, 20, ctx, mask)])
        outs.append(model(ids, positions, meta, cache, torch.tensor([19, 7])))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
