"""The decode-attention kernel on one model's shapes, per cache type: what a long-context row costs.

    homeai bench kernels --attention 1x1700,12x1700,16x200 [--shape smollm2-135m] [--json]

For each ``ROWSxCONTEXT``: milliseconds for one decode step's attention over every layer (rows whose
contexts lie in random 16-slot blocks of a cache sized for them, as the block manager scatters them) with a
float32 and a float16 cache, and the cache bytes read per second. Best of ``repeats``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from homeai.bench.kernel_bench import best_ms
from homeai.runtime.llama_config import LlamaConfig

BLOCK = 16
CACHE_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"1x1700,12x1700"`` -> [(1, 1700), (12, 1700)]."""
    out = []
    for part in text.split(","):
        rows, _, ctx = part.partition("x")
        out.append((int(rows), int(ctx)))
    return out


def _step(op: Callable[..., torch.Tensor], q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor,
          lens: torch.Tensor) -> None:
    """One decode step's attention: every layer of the cache."""
    for layer in range(kv.shape[0]):
        op(q, kv, layer, slots, lens)


def run_attention(cfg: LlamaConfig, shapes: list[tuple[int, int]], repeats: int = 5,
                  log: Any = print) -> dict[str, Any]:
    from homeai.runtime.kernels import decode_attention

    op = decode_attention()
    if op is None:
        raise RuntimeError("the native decode-attention kernel is not available on this machine")
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "layers": cfg.num_layers, "steps": {}}
    for rows, ctx in shapes:
        blocks_per_row = -(-ctx // BLOCK)
        num_blocks = rows * blocks_per_row
        order = torch.randperm(num_blocks, generator=gen).view(rows, blocks_per_row)
        slots = (order.unsqueeze(-1) * BLOCK + torch.arange(BLOCK)).view(rows, -1)[:, :ctx].contiguous()
        lens = torch.full((rows,), ctx, dtype=torch.long)
        q = torch.randn(rows, cfg.num_heads, cfg.head_dim, generator=gen)
        kv32 = torch.randn(cfg.num_layers, num_blocks * BLOCK, 2, cfg.num_kv_heads, cfg.head_dim, generator=gen)
        result: dict[str, float] = {}
        for name, dtype in CACHE_DTYPES.items():
            kv = kv32.to(dtype)
            ms = best_ms(functools.partial(_step, op, q, kv, slots, lens), repeats)
            read = rows * ctx * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * kv.element_size()
            result[f"{name}_ms"] = ms
            result[f"{name}_gb_s"] = read / ms / 1e6
            del kv
        out["steps"][f"{rows}x{ctx}"] = result
        log(f"{rows:3d} rows x {ctx:5d} tokens: " + "  ".join(
            f"{n} {result[n + '_ms']:.2f} ms ({result[n + '_gb_s']:.1f} GB/s)" for n in CACHE_DTYPES))
    return out
