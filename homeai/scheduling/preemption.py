"""Who gives way when a step runs short of sequence slots or KV blocks, decided before anyone does.

Preempting a sequence throws away every token computed for it (it is recomputed when it runs again),
so a preemption is only worth making when it makes the room it is made for. The planner first lists
the victims it would take, least important first (class rank, then newest first), sums what they would
give back, and preempts them only if that is enough; otherwise nobody. With prefix caching a block
another running sequence also holds is not given back, so it does not count.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from homeai.core.block_manager import BlockManager
from homeai.core.sequence import Sequence

Rank = Callable[[Sequence], int]  # a sequence's class rank: lower is more important


def importance(seq: Sequence, rank: Rank) -> tuple[int, float, int]:
    """Sort key: smaller is more important (class rank, then older first)."""
    return rank(seq), seq.arrival_s, seq.seq_id


def victim_order(running: list[Sequence], rank: Rank, exclude: Container[int] = ()) -> list[Sequence]:
    """Running sequences outside ``exclude``, least important first."""
    return sorted((s for s in running if s.seq_id not in exclude), key=lambda s: importance(s, rank),
                  reverse=True)


def blocks_freed(bm: BlockManager, running: list[Sequence], seqs: list[Sequence]) -> int:
    """Blocks preempting ``seqs`` would give back to the pool."""
    if not bm.enable_prefix_caching:
        return sum(len(bm.block_table(s.seq_id)) for s in seqs)
    gone = {s.seq_id for s in seqs}
    kept = {b for s in running if s.seq_id not in gone for b in bm.block_table(s.seq_id)}
    return len({b for s in seqs for b in bm.block_table(s.seq_id)} - kept)


def blocks_short(bm: BlockManager, seq: Sequence, num_tokens: int, headroom: int = 0) -> int:
    """KV blocks the pool lacks for ``num_tokens`` of ``seq`` with ``headroom`` blocks left free (0: they
    fit). A negative reserve asks ``can_allocate`` whether that many fewer blocks would do, so a cached
    prefix counts as the block manager counts it."""
    short = max(0, bm.num_new_blocks(seq.seq_id, num_tokens) + headroom - bm.num_free_blocks)
    while not bm.can_allocate(seq.seq_id, num_tokens, reserve=headroom - short):
        short += 1
    return short


def plan_victims(bm: BlockManager, running: list[Sequence], order: list[Sequence], num_blocks: int,
                 need_slot: bool, keeps_slot: Container[int] = ()) -> list[Sequence] | None:
    """The first of ``order`` that together give back ``num_blocks`` KV blocks and, if ``need_slot``, a
    sequence slot (not one of ``keeps_slot``: a background share's); None when all of them cannot."""
    victims: list[Sequence] = []
    for seq in order:
        enough_kv = blocks_freed(bm, running, victims) >= num_blocks
        if enough_kv and not need_slot:
            return victims
        if enough_kv and seq.seq_id in keeps_slot:
            continue  # only a slot is wanted, and this one keeps its own
        victims.append(seq)
        need_slot = False
    return victims if blocks_freed(bm, running, victims) >= num_blocks and not need_slot else None
