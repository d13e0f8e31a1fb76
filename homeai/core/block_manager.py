"""Hands out fixed-size KV blocks from a preallocated pool and keeps each sequence's block table.

Plain Python (no torch): the scheduler asks ``can_allocate`` before admitting or extending a sequence,
and preempts when the pool runs dry instead of failing a request.
"""

from __future__ import annotations


class BlockManager:
    """A free list of block ids; a sequence owns the blocks in its table until it finishes or is preempted."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, seq_id: int) -> list[int]:
        return self._tables.get(seq_id, [])

    def num_new_blocks(self, seq_id: int, num_tokens: int) -> int:
        """Blocks a sequence still needs so that ``num_tokens`` of its tokens have a slot."""
        return max(0, self.blocks_needed(num_tokens) - len(self._tables.get(seq_id, ())))

    def can_allocate(self, seq_id: int, num_tokens: int, reserve: int = 0) -> bool:
        return self.num_new_blocks(seq_id, num_tokens) + reserve <= len(self._free)

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grow the sequence's table to cover ``num_tokens`` tokens; raises if the pool is short."""
        need = self.num_new_blocks(seq_id, num_tokens)
        if need > len(self._free):
            raise MemoryError(f"KV pool exhausted: need {need} blocks, {len(self._free)} free")
        table = self._tables.setdefault(seq_id, [])
        for _ in range(need):
            table.append(self._free.pop())
        return table

    def free(self, seq_id: int) -> int:
        """Return every block of the sequence to the pool (finish, abort, preemption); returns the count."""
        table = self._tables.pop(seq_id, [])
        self._free.extend(reversed(table))
        return len(table)

    def slot(self, seq_id: int, position: int) -> int:
        table = self._tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def check_conserved(self) -> None:
        """Every block is either free or in exactly one table (tests call this after each step)."""
        owned = [b for t in self._tables.values() for b in t]
        all_ids = owned + self._free
        if len(all_ids) != self.num_blocks or set(all_ids) != set(range(self.num_blocks)):
            raise AssertionError(f"blocks not conserved: {len(owned)} owned + {len(self._free)} free "
                                 f"!= {self.num_blocks}")
