"""The native kernels (homeai.runtime.kernels). int8: exact against a float64 reference for every row
count a decode step can have (both the AVX-512 and the AVX2 variant), clear errors for wrong inputs,
Int8Linear's choice of kernel by row count. float32 on packed panels: the same against the plain matmul,
odd shapes included, and a packed layer's embedding rows. int8 heads in tiles (int16 activations, VNNI):
within their activations' rounding of the float64 product at every row count, the table's rows as the
row-major layer has them. All: torch.compile tracing through them, and the fallback to torch's kernels
when they cannot be built or are switched off."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from homeai.runtime import kernels
from homeai.runtime.quant import (
    NATIVE_MAX_ROWS,
    Int8Linear,
    Linear,
    PackedLinear,
    TiledInt8Linear,
    make_linear,
    quantize_int8,
)

CPU = torch.device("cpu")
needs_avx512 = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                                  reason="float32 weights are packed only on CPUs with AVX-512")
needs_vnni = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512"
                                or not kernels.cpu_has_vnni(), reason="int8 heads are tiled only with VNNI")


@pytest.fixture(scope="module")
def native() -> object:
    op = kernels.int8_linear()
    assert op is not None, "the native int8 kernel did not build (is a C++ compiler installed?)"
    return op


def reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (F.linear(x.double(), q.double()) * scale.double()).float()


def float32_error_bound(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> float:
    """What float32 accumulation may lose over K products (a standard a-priori bound, loose by design):
    any indexing or tail bug misses by the size of the outputs, orders of magnitude more."""
    eps = torch.finfo(torch.float32).eps
    return x.shape[1] * eps * float(x.abs().max()) * float(q.abs().max()) * float(scale.max())


@pytest.mark.parametrize("variant", ["int8_linear", "int8_linear_avx2"])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 16, 17, 33])
def test_kernel_matches_float64_reference(native: object, variant: str, rows: int) -> None:
    op = getattr(torch.ops.homeai, variant)
    gen = torch.Generator().manual_seed(rows)
    for n, k in [(7, 16), (130, 576), (576, 1536), (1000, 64)]:  # row tails of 1..3, several blocks
        x = torch.randn(rows, k, generator=gen)
        q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        scale = torch.rand(n, generator=gen) / 100
        got = op(x, q, scale)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        torch.testing.assert_close(got, reference(x, q, scale), rtol=0, atol=float32_error_bound(x, q, scale))


def test_kernel_rejects_wrong_inputs_with_a_reason(native: object) -> None:
    op = torch.ops.homeai.int8_linear
    x, q, scale = torch.randn(2, 32), torch.zeros(4, 32, dtype=torch.int8), torch.ones(4)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        op(torch.randn(2, 24), torch.zeros(4, 24, dtype=torch.int8), scale)
    with pytest.raises(RuntimeError, match="x float32, q int8, scale float32"):
        op(x.double(), q, scale)
    with pytest.raises(RuntimeError, match=r"q \[N, K\]"):
        op(x, torch.zeros(4, 48, dtype=torch.int8), scale)
    assert op(torch.randn(0, 32), q, scale).shape == (0, 4)


@needs_avx512
def test_int8_to_bf16_is_exact_and_prompt_sized_inputs_use_it(native: object,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.arange(-128, 128, dtype=torch.int8).repeat(40)[:10_001].contiguous()  # every value, a tail
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    torch.ops.homeai.int8_to_bf16(out, q)
    assert torch.equal(out, q.to(torch.bfloat16))
    layer = make_linear(torch.randn(96, 64), None, "int8", CPU, torch.float32)
    x = torch.randn(NATIVE_MAX_ROWS + 14, 64)
    fast = layer(x)
    monkeypatch.setattr(layer, "_to_bf16", None)  # torch's conversion: the same bfloat16 weights
    assert torch.equal(fast, layer(x))


@pytest.mark.parametrize("rows", [1, 5, NATIVE_MAX_ROWS, NATIVE_MAX_ROWS + 1])
def test_int8_linear_takes_the_native_kernel_up_to_its_row_limit(native: object, rows: int) -> None:
    torch.manual_seed(rows)
    w, x = torch.randn(48, 64), torch.randn(rows, 64)
    layer = make_linear(w, None, "int8", CPU, torch.float32)
    assert isinstance(layer, Int8Linear) and layer._native is not None
    q, scale = quantize_int8(w)
    got, exact = layer(x), reference(x, q, scale)
    bound = float32_error_bound(x, q, scale)
    if rows <= NATIVE_MAX_ROWS:  # float32 activations: float32 rounding only
        torch.testing.assert_close(got, exact, rtol=0, atol=bound)
    else:  # bfloat16 activations (the prefill path): ~3 significant digits
        assert float((got - exact).abs().max()) <= 2e-2 * float(exact.abs().max())
        assert float((got - exact).abs().max()) > bound



@needs_avx512
@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 33, 200])  # 200: more than one 128-row sweep
def test_packed_float_linear_matches_the_plain_matmul(native: object, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    for n, k in [(960, 576), (7, 5), (49, 576), (33, 1536)]:  # partial last panels, odd K
        w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
        x = torch.randn(rows, k, generator=gen)
        layer = make_linear(w, b, "none", CPU, torch.float32)
        assert isinstance(layer, PackedLinear) and layer.num_weights == n * k
        exact = (F.linear(x.double(), w.double()) + b.double()).float()
        bound = k * torch.finfo(torch.float32).eps * float(x.abs().max()) * float(w.abs().max())
        torch.testing.assert_close(layer(x), exact, rtol=0, atol=bound + 1e-6)
        ids = torch.tensor([0, n - 1, n // 2, 0])
        assert torch.equal(layer.embed(ids, torch.float32), w[ids])  # a tied embedding's rows, exactly


@needs_avx512
def test_packed_float_linear_rejects_a_wrong_column_count(native: object) -> None:
    from homeai.runtime.kernels import pack_float_weight

    packed = pack_float_weight(torch.randn(40, 16))  # two panels: 33..64 columns fit
    with pytest.raises(RuntimeError, match="got N=70"):
        torch.ops.homeai.float_linear(torch.randn(2, 16), packed, 70)


def sdpa_reference(q: torch.Tensor, kv: torch.Tensor, layer: int, slots: torch.Tensor,
                   lens: torch.Tensor) -> torch.Tensor:
    """The torch path the kernel replaces: gather each row's context, SDPA under a length mask, in float64."""
    b, heads, d = q.shape
    kv_heads = kv.shape[3]
    ctx = kv[layer][slots].double()  # [B, L, 2, kv_heads, d]
    mask = (torch.arange(slots.shape[1]) < lens[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q.double().reshape(b, kv_heads, heads // kv_heads, d),
                                         ctx[:, :, 0].transpose(1, 2), ctx[:, :, 1].transpose(1, 2), attn_mask=mask)
    return out.reshape(b, heads, d).float()


@needs_avx512
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "d"), [(9, 3, 64), (32, 8, 64), (8, 8, 128), (14, 2, 64), (12, 1, 64)])
def test_decode_attention_matches_gather_and_sdpa(native: object, heads: int, kv_heads: int, d: int,
                                                  cache_dtype: torch.dtype) -> None:
    """Any cache type: its values, widened exactly to float32, give what float64 SDPA gives on them."""
    gen = torch.Generator().manual_seed(heads * d)
    # scores spread wide: a peaked softmax too
    kv = (torch.randn(3, 700, 2, kv_heads, d, generator=gen) * 2).to(cache_dtype)
    lens = torch.tensor([1, 5, 16, 17, 150, 200])  # one token, partial and whole vector tails, full rows
    slots = torch.randint(0, 700, (6, 200), generator=gen)
    q = torch.randn(6, heads, d, generator=gen)
    got = torch.ops.homeai.decode_attention(q, kv, 2, slots, lens)
    torch.testing.assert_close(got, sdpa_reference(q, kv, 2, slots, lens), rtol=1e-4, atol=1e-5)
    short = lens.clamp(max=150)
    slots[:, 150:] = 0  # what lies past a row's length is never read
    torch.testing.assert_close(torch.ops.homeai.decode_attention(q, kv, 2, slots, short),
                               sdpa_reference(q, kv, 2, slots, short), rtol=1e-4, atol=1e-5)


@needs_avx512
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("row_lens", [[1700, 3, 257], [200], [65]])
def test_decode_attention_splits_long_rows_across_threads_and_merges_them(native: object, cache_dtype: torch.dtype,
                                                                          row_lens: list[int]) -> None:
    """One row of 1,700 positions (spans of 64 and more, on every thread) beside short ones, and one stream's
    lone row (200 positions: three whole spans and a part; 65: a span and one position): the spans' partial
    softmaxes merge into the whole row's."""
    gen = torch.Generator().manual_seed(5)
    kv = (torch.randn(2, 2048, 2, 3, 64, generator=gen) * 2).to(cache_dtype)
    lens = torch.tensor(row_lens)
    slots = torch.randperm(2048, generator=gen)[:max(row_lens)].repeat(len(row_lens), 1)
    q = torch.randn(len(row_lens), 9, 64, generator=gen) * 2
    for threads in (1, 2):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            got = torch.ops.homeai.decode_attention(q, kv, 1, slots, lens)
        finally:
            torch.set_num_threads(before)
        torch.testing.assert_close(got, sdpa_reference(q, kv, 1, slots, lens), rtol=1e-4, atol=1e-5)


@needs_avx512
def test_decode_attention_rejects_wrong_inputs_with_a_reason(native: object) -> None:
    op = torch.ops.homeai.decode_attention
    kv, slots, lens = torch.zeros(2, 32, 2, 3, 64), torch.zeros(1, 4, dtype=torch.long), torch.ones(1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="head_dim 64 or 128"):
        op(torch.zeros(1, 9, 32), torch.zeros(2, 32, 2, 3, 32), 0, slots, lens)
    with pytest.raises(RuntimeError, match="layer out of range"):
        op(torch.zeros(1, 9, 64), kv, 2, slots, lens)
    with pytest.raises(RuntimeError, match="head counts"):
        op(torch.zeros(1, 8, 64), kv, 0, slots, lens)
    with pytest.raises(RuntimeError, match="slot 32 of row 0 outside the cache's 32 slots"):
        op(torch.zeros(1, 9, 64), kv, 0, torch.tensor([[3, 32, 0, 0]]), torch.tensor([2]))
    op(torch.zeros(1, 9, 64), kv, 0, torch.tensor([[3, 4, 99, -1]]), torch.tensor([2]))  # past the length: unread


@needs_avx512
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "d"), [(9, 3, 64), (32, 8, 64), (8, 8, 128), (14, 2, 64), (12, 1, 64),
                                                      (16, 1, 64)])
@pytest.mark.parametrize(("start", "n"), [(0, 1), (0, 5), (0, 46), (0, 100), (10, 36), (37, 16), (300, 70)])
@pytest.mark.parametrize("bf16_dots", [False, True])
def test_prefill_attention_is_each_row_as_a_decode_row(native: object, heads: int, kv_heads: int, d: int,
                                                       cache_dtype: torch.dtype, start: int, n: int,
                                                       bf16_dots: bool) -> None:
    """A chunk of n rows after start cached positions: row i is the decode row at position start + i over the
    slots of positions 0 .. start + i (causal), whatever the group size (rows per block), a partial last
    block or tile, a cached prefix, or the cache's type. In bfloat16 products (where the CPU has them):
    against the reference on the same queries, keys and values rounded to bfloat16, within the rounding of
    the softmax weights (up to 2 ** -9 of each) and float32 sums; a wrong position or slot misses by the
    size of the values (~2)."""
    gen = torch.Generator().manual_seed(heads * d + start + n)
    kv = (torch.randn(2, 1024, 2, kv_heads, d, generator=gen) * 2).to(cache_dtype)
    slots = torch.randperm(1024, generator=gen)[:start + n]
    q = torch.randn(n, heads, d, generator=gen) * 2
    got = torch.ops.homeai.prefill_attention(q, kv, 1, slots, start, bf16_dots)
    lens = torch.arange(start + 1, start + n + 1)
    if bf16_dots and torch.cpu._is_avx512_bf16_supported():
        scale = d ** -0.5  # the kernel rounds the scaled query
        rounded_q = (q * scale).bfloat16().float() / scale
        want = sdpa_reference(rounded_q, kv.float().bfloat16().float(), 1, slots.repeat(n, 1), lens)
        torch.testing.assert_close(got, want, rtol=0, atol=2e-2)
    else:
        want = sdpa_reference(q, kv, 1, slots.repeat(n, 1), lens)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_avx512
def test_prefill_attention_on_one_thread_and_two(native: object) -> None:
    """Blocks are shared out between threads: the same answer on one."""
    gen = torch.Generator().manual_seed(3)
    kv = (torch.randn(1, 512, 2, 3, 64, generator=gen) * 2).to(torch.float16)
    slots, q = torch.randperm(512, generator=gen)[:130], torch.randn(90, 9, 64, generator=gen)
    before = torch.get_num_threads()
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            outs += [torch.ops.homeai.prefill_attention(q, kv, 0, slots, 40, bf16) for bf16 in (False, True)]
        finally:
            torch.set_num_threads(before)
    torch.testing.assert_close(outs[0], outs[2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[1], outs[3], rtol=1e-5, atol=1e-6)


@needs_avx512
def test_prefill_attention_rejects_wrong_inputs_with_a_reason(native: object) -> None:
    op = torch.ops.homeai.prefill_attention
    kv = torch.zeros(2, 32, 2, 3, 64)
    with pytest.raises(RuntimeError, match="slots \\[start \\+ n\\]"):
        op(torch.zeros(4, 9, 64), kv, 0, torch.arange(5), 2, False)
    with pytest.raises(RuntimeError, match="head counts"):
        op(torch.zeros(4, 8, 64), kv, 0, torch.arange(4), 0, False)
    with pytest.raises(RuntimeError, match="slot 32 of position 1 outside the cache's 32 slots"):
        op(torch.zeros(2, 9, 64), kv, 0, torch.tensor([3, 32]), 0, True)


@pytest.mark.parametrize("fmt", ["int8", "none", "int8-head"])
def test_compiled_graph_calls_the_native_kernel(native: object, fmt: str) -> None:
    torch.manual_seed(0)
    layer = make_linear(torch.randn(96, 64), None, fmt.removesuffix("-head"), CPU, torch.float32,
                        head=fmt.endswith("-head"))
    x = torch.randn(3, 64)
    compiled = torch.compile(lambda t: torch.relu(layer(t)) + 1, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x), torch.relu(layer(x)) + 1)


def test_without_the_native_kernel_torchs_kernels_serve(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.setenv("HOMEAI_NATIVE_KERNELS", "0")
    assert kernels.int8_linear() is None and kernels.float_linear() is None
    assert type(make_linear(torch.randn(8, 16), None, "none", CPU, torch.float32)) is Linear

    def broken() -> None:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.delenv("HOMEAI_NATIVE_KERNELS")
    monkeypatch.setattr(kernels, "_build", broken)
    with caplog.at_level(logging.WARNING, logger="homeai.runtime.kernels"):
        assert kernels.int8_linear() is None and kernels.float_linear() is None
    assert "no compiler here" in caplog.text
    w, x = torch.randn(48, 64), torch.randn(4, 64)
    layer = make_linear(w, None, "int8", CPU, torch.float32)
    assert layer._native is None  # torch's packed kernel (bfloat16 activations) instead
    q, scale = quantize_int8(w)
    exact = reference(x, q, scale)
    assert float((layer(x) - exact).abs().max()) <= 2e-2 * float(exact.abs().max())


@needs_avx512
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 17, 24, 25, 33, 64, 65, 80, 300])  # 300: a prompt chunk
@pytest.mark.parametrize("k", [576, 1536, 96])
def test_int4_layer_matches_its_dequantized_weights(rows: int, k: int) -> None:
    """Int4Linear's kernels against the float64 product with the weights the groups describe: int8
    activations (VNNI) and float32 activations for every row count, and the layer's own choice (up to
    INT4_NATIVE_MAX_ROWS the native kernel, above it bfloat16 weights), on SmolLM2's two K and an odd one."""
    from homeai.runtime.quant import Int4Linear, quantize_q4_1

    torch.manual_seed(rows + k)
    w = torch.randn(96, k)
    layer = make_linear(w, None, "int4", CPU, torch.float32)
    assert isinstance(layer, Int4Linear) and layer._native is not None
    q, dm = quantize_q4_1(w)
    dequant = q.double().view(96, -1, 32) * dm[..., 0, None].double() + dm[..., 1, None].double()
    x = torch.randn(rows, k)
    want = x.double() @ dequant.view(96, k).T
    scale = want.abs().max()
    # int8 activations in groups of 32 (as llama.cpp's Q8): 1/254 of each group's range; float32: rounding
    int8_act = layer._native(x, layer.weight, layer.scales_zeros, True).double()
    float_act = layer._native(x, layer.weight, layer.scales_zeros, False).double()
    assert (int8_act - want).abs().max() <= 2e-2 * scale, rows
    assert (float_act - want).abs().max() <= 1e-5 * scale, rows
    # the layer: bfloat16 weights above the native kernel's rows (2^-9 of each weight)
    assert (layer(x).double() - want).abs().max() <= 2e-2 * scale, rows
    assert torch.allclose(layer._weight_bf16().double(), dequant.view(96, k), rtol=2 ** -8, atol=0)


@needs_avx512
def test_int4_kernel_rejects_a_layout_it_does_not_read(native: object) -> None:
    from homeai.runtime.quant import Int4Linear

    layer = make_linear(torch.randn(32, 64), None, "int4", CPU, torch.float32)
    assert isinstance(layer, Int4Linear)
    op, x = torch.ops.homeai.int4_linear, torch.randn(2, 64)
    with pytest.raises(RuntimeError, match=r"q \[N/16, K/32, 256\]"):
        op(x, layer.weight.view(32, 32), layer.scales_zeros, True)  # the row-major blocks, not tiles
    with pytest.raises(RuntimeError, match=r"sz \[N/16, K/32, 32\]"):
        op(x, layer.weight, layer.scales_zeros.view(32, 2, 2), True)


def int16_activation_bound(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> float:
    """What int16 activations (each rounded by at most half of its group's absmax / 32767) may move an
    output, plus float32 rounding: an indexing or layout bug misses by the outputs' size, ~100x more."""
    return x.shape[1] * float(x.abs().max()) / 65534 * float(q.abs().max()) * float(scale.max()) + \
        float32_error_bound(x, q, scale)


@needs_vnni
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64])
def test_tiled_int8_head_matches_float64_reference(native: object, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    for n, k in [(16, 32), (48, 96), (1024, 576)]:  # one tile; odd tile and group counts; a head's K
        w = torch.randn(n, k, generator=gen)
        layer = make_linear(w, None, "int8", CPU, torch.float32, head=True)
        assert isinstance(layer, TiledInt8Linear)
        q, scale = quantize_int8(w)
        x = torch.randn(rows, k, generator=gen) * torch.rand(1, k, generator=gen) * 4  # groups of unlike ranges
        got = layer(x)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        torch.testing.assert_close(got, reference(x, q, scale), rtol=0, atol=int16_activation_bound(x, q, scale))
        assert layer(torch.randn(0, k)).shape == (0, n)


@needs_vnni
def test_tiled_head_embeds_the_rows_the_row_major_layer_has(native: object) -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 96)
    tiled = make_linear(w, None, "int8", CPU, torch.float32, head=True)
    plain = make_linear(w, None, "int8", CPU, torch.float32)
    assert isinstance(tiled, TiledInt8Linear) and isinstance(plain, Int8Linear)
    ids = torch.tensor([[0, 15, 16, 63], [5, 5, 40, 1]])
    assert torch.equal(tiled.embed(ids, torch.float32), plain.embed(ids, torch.float32))
    assert tiled.nbytes == plain.nbytes and tiled.num_weights == 64 * 96
    with pytest.raises(RuntimeError, match=r"qt int8 \[N/16, K/2, 32\]"):
        torch.ops.homeai.int8_linear_tiled(torch.randn(2, 96), plain.q, tiled.scale_f32)  # row-major: not tiles
    assert type(make_linear(torch.randn(40, 96), None, "int8", CPU, torch.float32, head=True)) is Int8Linear  # 40 rows


@needs_avx512
@pytest.mark.parametrize(("rows", "vocab"), [(0, 49152), (1, 49152), (3, 17), (9, 49152), (2, 100_003)])
def test_argmax_logsumexp_is_torchs(native: object, rows: int, vocab: int) -> None:
    """Each row's first maximum and its log-sum-exp, as torch's, at any vocabulary size (a partial last
    vector), from rows of any count."""
    gen = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=gen) * 5
    tokens, lse = torch.ops.homeai.argmax_logsumexp(logits)
    assert tokens.dtype == torch.long and tokens.shape == lse.shape == (rows,)
    assert torch.equal(tokens, logits.argmax(-1))
    torch.testing.assert_close(lse, logits.logsumexp(-1), rtol=1e-6, atol=1e-5)


@needs_avx512
def test_argmax_logsumexp_takes_the_first_maximum_and_skips_forbidden_tokens(native: object) -> None:
    """Ties go to the first index (in another lane, in a later vector, in the tail), -inf (a grammar's
    forbidden token) adds nothing, and a row with every token forbidden gives index 0 and -inf, as torch."""
    logits = torch.full((5, 70), -1.0)
    logits[0, [3, 19, 40]] = 2.0  # the first of three maxima, in different lanes and vectors
    logits[1, [69, 64]] = 2.0  # both in the tail
    logits[2] = float("-inf")
    logits[2, 50] = 0.5  # one allowed token
    logits[3] = float("-inf")  # none allowed
    logits[4, [17, 1]] = 3.0  # the earlier one sits in a lower lane of the first vector
    tokens, lse = torch.ops.homeai.argmax_logsumexp(logits)
    assert tokens.tolist() == [3, 64, 50, 0, 1] == logits.argmax(-1).tolist()
    torch.testing.assert_close(lse, logits.logsumexp(-1))
    assert lse[3] == float("-inf")
