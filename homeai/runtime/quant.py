"""Weight-only int8 quantization (per output channel) and the linear layers the decoder calls.

Why int8 weights: decoding one token reads every weight once, so on a CPU (and a GPU at small batch)
a step costs what its weight bytes cost to read. int8 reads a quarter of float32.

Which kernel, measured on this machine (2-core Xeon with AVX512-BF16/AMX, torch 2.13, see
``homeai bench engine``): ``torch._weight_int8pack_mm`` with bfloat16 activations is 2-5x faster
than the float32 matmul up to 16 rows (the lm_head of SmolLM2: 0.9-1.0 ms against 2.4-4.9 ms at one
row), about even at 16 rows, and 1.5-2.5x slower from 32 rows on; with float32 activations it is 4-20x
slower than float32 (no fast path). A bfloat16 dequantize-then-matmul wins from 32 rows up (AMX), so
prefill chunks take that path and decode steps the packed one. ``PACK_MAX_ROWS`` holds the crossover.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

QUANTIZATIONS = ("none", "int8")
# Up to this many rows the packed int8 kernel runs; above, a bf16 dequantize-matmul (see the docstring).
PACK_MAX_ROWS = int(os.environ.get("HOMEAI_INT8_PACK_MAX_ROWS", "16"))


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


class Int8Linear(Linear):
    """int8 weight with one scale per output row; no float copy of the weight is kept.

    Activations enter the kernel as bfloat16 (the packed kernel's fast path) and leave in the input's
    dtype; accumulation is in float32 inside the kernel.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.q = q.contiguous()
        self.scale = scale.to(device=q.device, dtype=torch.bfloat16)
        super().__init__(self.q, bias)
        self._packed_ok = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        if x2.shape[0] <= PACK_MAX_ROWS and self._packed_ok:
            try:
                out = torch._weight_int8pack_mm(x2, self.q, self.scale)
            except (RuntimeError, NotImplementedError):  # no kernel for this device: dequantize from now on
                self._packed_ok = False
                return self(x)
        else:
            out = F.linear(x2, self.q.to(torch.bfloat16)) * self.scale
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], -1)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (self.q[ids].to(torch.float32) * self.scale[ids, None].float()).to(dtype)

    @property
    def nbytes(self) -> int:
        extra = self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        return self.q.numel() + self.scale.numel() * self.scale.element_size() + extra


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, quantization: str, device: torch.device,
                dtype: torch.dtype) -> Linear:
    """The layer for ``quantization`` on ``device``: "none" casts ``weight`` to ``dtype``; "int8" quantizes
    it from its own precision (on the host, so a GPU never holds the float copy) and moves only q/scale."""
    bias = None if bias is None else bias.to(device=device, dtype=dtype)
    if quantization == "int8":
        q, scale = quantize_int8(weight)
        return Int8Linear(q.to(device), scale.to(device), bias)
    if quantization == "none":
        return Linear(weight.to(device=device, dtype=dtype).contiguous(), bias)
    raise ValueError(f"unknown quantization {quantization!r}; choose one of {QUANTIZATIONS}")
