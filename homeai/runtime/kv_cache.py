"""The paged KV cache's storage: per layer, one preallocated tensor of slots for keys and one for values.

A slot is ``block_id * block_size + offset``. The block manager (engine side, plain Python) hands out
blocks; this module only stores and fetches by slot, so the two never disagree about layout.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for ``num_blocks * block_size`` token slots in every layer, sized once at start."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        num_slots = num_blocks * block_size
        self.k = torch.zeros(num_layers, num_slots, num_kv_heads, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at ``slots`` (any shape S), as tensors of shape S + [kv_heads, head_dim]."""
        flat = slots.reshape(-1)
        shape = (*slots.shape, *self.k.shape[2:])
        return (self.k[layer].index_select(0, flat).view(shape),
                self.v[layer].index_select(0, flat).view(shape))
