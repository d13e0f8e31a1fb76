"""The paged KV cache's storage: per layer, one preallocated tensor of slots for keys and one for values.

A slot is ``block_id * block_size + offset``. The block manager (engine side, plain Python) hands out
blocks; this module only stores and fetches by slot, so the two never disagree about layout.

The cache's element type may be narrower than the model's activations (``kv_cache_dtype``): a decode row
reads its whole context every step, so at a long context the cache, not the weights, is what a row costs
(12 rows at 1,700 tokens read 940 MB of float32 keys and values per step on SmolLM2, against ~100 MB of
int4 weights). float16 halves that and doubles the tokens a pool holds, as llama.cpp's default cache type.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from homeai.runtime.kv_prefault import KVPrefaulter

KV_CACHE_DTYPE_ENV = "HOMEAI_KV_CACHE_DTYPE"  # "auto" (default), "float32", "float16" or "bfloat16"
KV_CACHE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def kv_cache_dtype(model_dtype: torch.dtype, quantization: str, native_attention: bool,
                   choice: str | None = None) -> torch.dtype:
    """The cache's element type. "auto": float16 for quantized weights where the native decode kernel
    reads the cache (their prompts already pass through bfloat16 matmuls; the cache's 10-bit mantissa is
    what llama.cpp keeps by default), else the model's dtype (float32 weights stay the exact reference,
    and without the kernel a 16-bit cache would be widened on every read). ``choice`` defaults to
    HOMEAI_KV_CACHE_DTYPE."""
    choice = choice or os.environ.get(KV_CACHE_DTYPE_ENV) or "auto"
    if choice == "auto":
        return torch.float16 if native_attention and quantization != "none" else model_dtype
    if choice not in KV_CACHE_DTYPES:
        raise ValueError(f"{KV_CACHE_DTYPE_ENV} must be auto or one of {sorted(KV_CACHE_DTYPES)}, not {choice!r}")
    return KV_CACHE_DTYPES[choice]


class KVCache:
    """Keys and values for ``num_blocks * block_size`` token slots in every layer, sized once at start."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # One block more than the block manager hands out: a scratch block that no sequence owns, where
        # the padding rows of a compiled decode step (homeai.runtime.decode_graph) write and read.
        self.scratch_slot = num_blocks * block_size
        num_slots = (num_blocks + 1) * block_size
        # keys and values of a slot side by side: the layout of the k|v half of a fused qkv projection,
        # so a layer writes both with one index_copy and reads both with one index_select.
        shape = (num_layers, num_slots, 2, num_kv_heads, head_dim)
        self.kv = _lazy_zeros(shape, dtype) if device.type == "cpu" else torch.zeros(shape, device=device, dtype=dtype)
        # Lazy pages are made resident just ahead of use (see kv_prefault); the builder connects it to the
        # block manager (``BlockManager.on_block``).
        self.prefault = KVPrefaulter(self.kv, num_blocks, block_size) if device.type == "cpu" else None

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def write(self, layer: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Store ``kv`` [T, 2, kv_heads, head_dim] at ``slots`` [T] (in the cache's dtype)."""
        self.kv[layer].index_copy_(0, slots, kv.to(self.kv.dtype))

    def copy_prefix(self, src_block: int, dst_block: int, num_slots: int) -> None:
        """Copy the first ``num_slots`` slots of ``src_block`` into ``dst_block``, in every layer: a cached
        prefix that ends inside a block (``ScheduledChunk.kv_copy``)."""
        bs = self.block_size
        s, d = src_block * bs, dst_block * bs
        self.kv[:, d:d + num_slots].copy_(self.kv[:, s:s + num_slots])

    def gather(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Keys and values at ``slots`` (any shape S), as S + [2, kv_heads, head_dim], in the cache's dtype."""
        return self.kv[layer].index_select(0, slots.reshape(-1)).view(*slots.shape, *self.kv.shape[2:])


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros whose pages the OS hands out on first write: calloc maps large blocks as zero pages, so the
    pool costs resident memory only as sequences fill it (``torch.zeros`` writes every byte at start: the
    whole pool resident from the first second). Reads of untouched slots see zeros, as before."""
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = np.zeros(numel * itemsize, dtype=np.uint8)  # numpy's zeros is calloc
    return torch.from_numpy(raw).view(dtype).view(shape)
