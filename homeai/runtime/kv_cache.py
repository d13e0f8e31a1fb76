"""The paged KV cache's storage: per layer, one preallocated tensor of slots for keys and one for values.

A slot is ``block_id * block_size + offset``. The block manager (engine side, plain Python) hands out
blocks; this module only stores and fetches by slot, so the two never disagree about layout.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from homeai.runtime.kv_prefault import KVPrefaulter


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
        """Store ``kv`` [T, 2, kv_heads, head_dim] at ``slots`` [T]."""
        self.kv[layer].index_copy_(0, slots, kv)

    def gather(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Keys and values at ``slots`` (any shape S), as S + [2, kv_heads, head_dim]."""
        return self.kv[layer].index_select(0, slots.reshape(-1)).view(*slots.shape, *self.kv.shape[2:])


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros whose pages the OS hands out on first write: calloc maps large blocks as zero pages, so the
    pool costs resident memory only as sequences fill it (``torch.zeros`` writes every byte at start: the
    whole pool resident from the first second). Reads of untouched slots see zeros, as before."""
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = np.zeros(numel * itemsize, dtype=np.uint8)  # numpy's zeros is calloc
    return torch.from_numpy(raw).view(dtype).view(shape)
