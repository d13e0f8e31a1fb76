"""The matmul kernels side by side on one model's weight shapes: which one a decode step should take.

    homeai bench kernels [--shape smollm2-135m] [--rows 1,2,4,8,16,32,64] [--json]

One pass = every weight matrix of the model once (30 layers x qkv, o, gate_up, down, and the lm_head for
SmolLM2-135M), each with its own random weights, so the pass reads them from memory as a decode step
does, not from cache. Per row count: milliseconds per pass for the float32 matmul (MKL on the plain
layout, and our kernel on weights packed in panels), torch's packed int8 kernel (bfloat16 activations),
a bfloat16 dequantize-then-matmul (torch's conversion, and ours: what prompts take), and our int8 kernel
(homeai.runtime.kernels); and our int8 kernel's read rate in GB/s. Where the int4 kernel runs, the layers
(not the lm_head, which stays int8) as int4 too: with int8 activations (VNNI), with float32 activations,
and written out as bfloat16 for a bfloat16 matmul (what rows above ``INT4_NATIVE_MAX_ROWS`` take). Best of
``repeats``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from homeai.bench.engine_bench import best_s
from homeai.bench.shapes import SHAPES
from homeai.runtime.llama_config import LlamaConfig


def weight_shapes(cfg: LlamaConfig) -> list[tuple[int, int]]:
    """(out, in) of every linear layer of one decode step, in order, the tied lm_head last."""
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    per_layer = [(qkv, cfg.hidden_size), (cfg.hidden_size, cfg.num_heads * cfg.head_dim),
                 (2 * cfg.intermediate_size, cfg.hidden_size), (cfg.hidden_size, cfg.intermediate_size)]
    return per_layer * cfg.num_layers + [(cfg.vocab_size, cfg.hidden_size)]


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    return 1e3 * best_s(fn, repeats)


def run_kernels(cfg: LlamaConfig, rows: list[int], repeats: int = 5, log: Any = print) -> dict[str, Any]:
    from homeai.runtime.kernels import float_linear, int4_linear, int8_linear, pack_float_weight
    from homeai.runtime.quant import Int4Linear, quantize_int8

    native, packed_op = int8_linear(), float_linear()
    gen = torch.Generator().manual_seed(0)
    shapes = weight_shapes(cfg)
    dense = [torch.randn(n, k, generator=gen) * 0.02 for n, k in shapes]
    quantized = [quantize_int8(w) for w in dense]
    scales_bf16 = [s.to(torch.bfloat16) for _, s in quantized]
    packed = [pack_float_weight(w) for w in dense] if packed_op is not None else []
    int8_bytes = sum(q.numel() for q, _ in quantized)
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "native": native is not None,
                           "float32_packed": packed_op is not None,
                           "int8_mb": int8_bytes / 1e6, "rows": {}}
    int4 = [Int4Linear(w) for w in dense[:-1]] if int4_linear() is not None else []
    for m in rows:
        xs = [torch.randn(m, k, generator=gen) for _, k in shapes]
        row = _one_row_count(xs, dense, packed, packed_op, quantized, scales_bf16, native, repeats)
        if int4:
            row |= _int4_row_count(xs[:-1], int4, repeats)
        if native is not None:
            row["int8_native_gb_s"] = int8_bytes / row["int8_native"] / 1e6
        out["rows"][m] = row
        log(f"{m:3d} rows: " + "  ".join(f"{k} {v:.1f}" + ("" if k.endswith("gb_s") else " ms")
                                         for k, v in row.items()))
    return out


def _one_row_count(xs: list[torch.Tensor], dense: list[torch.Tensor], packed: list[torch.Tensor],
                   packed_op: Callable[..., torch.Tensor] | None, quantized: list[tuple[torch.Tensor, torch.Tensor]],
                   scales_bf16: list[torch.Tensor], native: Callable[..., torch.Tensor] | None,
                   repeats: int) -> dict[str, float]:
    """Milliseconds per pass of each kernel for one set of activations."""
    from homeai.runtime.kernels import int8_to_bf16

    xb = [x.to(torch.bfloat16) for x in xs]
    qs = [q for q, _ in quantized]
    row = {"float32": best_ms(lambda: [F.linear(x, w) for x, w in zip(xs, dense, strict=True)], repeats)}
    if packed_op is not None:
        row["float32_packed"] = best_ms(lambda: [packed_op(x, p, w.shape[0]) for x, p, w
                                                 in zip(xs, packed, dense, strict=True)], repeats)
    row |= {
        "torch_int8pack": best_ms(lambda: [torch._weight_int8pack_mm(x, q, s)
                                           for x, q, s in zip(xb, qs, scales_bf16, strict=True)], repeats),
        "bf16_dequantize": best_ms(lambda: [F.linear(x, q.to(torch.bfloat16)) * s
                                            for x, q, s in zip(xb, qs, scales_bf16, strict=True)], repeats),
    }
    to_bf16 = int8_to_bf16()
    if to_bf16 is not None:  # the same, with the native conversion into one reused buffer (Int8Linear's way)
        scratch = torch.empty(max(q.numel() for q in qs), dtype=torch.bfloat16)

        def converted(q: torch.Tensor) -> torch.Tensor:
            weight = scratch[:q.numel()].view(q.shape)
            to_bf16(weight, q)
            return weight

        row["bf16_dequantize_native"] = best_ms(lambda: [F.linear(x, converted(q)) * s for x, q, s
                                                         in zip(xb, qs, scales_bf16, strict=True)], repeats)
    if native is not None:
        row["int8_native"] = best_ms(lambda: [native(x, q, s) for x, (q, s) in zip(xs, quantized, strict=True)],
                                repeats)
    return row


def _int4_row_count(xs: list[torch.Tensor], layers: list[Any], repeats: int) -> dict[str, float]:
    """Milliseconds per pass over the int4 layers: the native kernel with int8 and with float32 activations,
    and the bfloat16 copy's matmul."""
    def native(int8_activations: bool) -> float:
        return best_ms(lambda: [la._native(x, la.weight, la.scales_zeros, int8_activations)
                                for x, la in zip(xs, layers, strict=True)], repeats)

    xb = [x.to(torch.bfloat16) for x in xs]
    return {"int4_int8_act": native(True), "int4_f32_act": native(False),
            "int4_bf16_dequantize": best_ms(lambda: [F.linear(x, la._weight_bf16())
                                                     for x, la in zip(xb, layers, strict=True)], repeats)}


def run_kernel_bench(args: argparse.Namespace) -> int:
    import sys

    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else print
    cfg = LlamaConfig(**SHAPES[args.shape])
    if args.attention:
        from homeai.bench.attention_bench import parse_shapes, run_attention

        out = run_attention(cfg, parse_shapes(args.attention), args.repeats, log)
    else:
        out = run_kernels(cfg, list(args.rows), args.repeats, log)
    if args.json:
        print(json.dumps(out))
    return 0
