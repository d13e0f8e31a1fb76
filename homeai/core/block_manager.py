"""Hands out fixed-size KV blocks from a preallocated pool, keeps each sequence's block table, and (when
prefix caching is on) keeps the blocks of finished sequences so that a later prompt with the same
prefix reuses their keys and values instead of computing them again.

Plain Python (no torch): the scheduler asks ``can_allocate`` before admitting or extending a sequence,
and preempts when the pool runs dry instead of failing a request.

Prefix caching, in the manner of vLLM v1: a *full* block is named by a hash chained over the hash of
the block before it, its token ids and the model (``block_hash``). A block is hashed only after a step
has written its tokens (``cache_blocks``, called as the scheduler applies a step), so an abort or a
preemption can never publish a block whose keys were not computed. Blocks are reference-counted: a
cached block may sit in several sequences' tables at once. A block nobody references is either plain
free (never hashed) or *evictable* (hashed, kept for reuse in LRU order); allocation takes plain free
blocks first and evicts the least recently used cached block only when none is left, and a block a
sequence holds is never evicted.

Beyond vLLM, a prefix may end inside a block, as llama.cpp's prompt cache reuses a prompt token by token:
a voice assistant's next turn repeats the system message and most of the words, and an identical prompt
would otherwise compute again up to 15 tokens its whole blocks leave over. Every block whose leading
tokens are known written is indexed by its parent's hash and its tokens (``BlockIndex``): the hashed full
blocks, and the last, partly written block of a sequence that ended (a *tail*; evictable as hashed blocks
are). A lookup that stops inside a block reuses the longest common run of tokens such a block holds: a
tail nobody holds the new sequence simply takes over (an identical prompt then computes its last token
only); a hashed block stays as it is, and its slots are copied into a fresh block of the new sequence
(``ScheduledChunk.kv_copy``: the runner copies before the step). A copy's source stays held (*pinned*)
until the scheduler applies that step, so no allocation can take it before the copy has run, and a
sequence's tail is indexed only once a step has run for it, so a copy that never ran is never passed on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from homeai.core.block_hash import BlockHash, extend_chain, root_hash
from homeai.core.block_index import BlockIndex
from homeai.core.prefix_stats import PrefixCacheStats
from homeai.core.sequence import Sequence


class BlockManager:
    """A pool of block ids; a sequence references the blocks in its table until it finishes or is
    preempted. ``num_free_blocks`` counts every block an allocation may take (free or evictable)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 model: str = "") -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.model = model
        self.stats = PrefixCacheStats()
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never hashed; pop() gives low ids first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # hashed, unreferenced; least recent first
        self._ref = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}  # hash -> the block holding that prefix's KV
        self._tables: dict[int, list[int]] = {}
        self._chains: dict[int, list[BlockHash]] = {}  # hashes of a sequence's full blocks, as far as known
        self._num_hashed: dict[int, int] = {}  # leading blocks of a table already published in _cached
        # The last lookup(), for the admission that follows it: (seq id, cached blocks found, its chain).
        # Only one is kept, so a request that never gets admitted (a queue timeout) leaves nothing behind.
        # The partial block it found, if any: (source block, tokens whose KV the source holds for this prompt).
        self._pending: tuple[int, list[int], list[BlockHash], tuple[int, int] | None] | None = None
        self._index = BlockIndex()  # blocks whose leading tokens are written (hashed ones and tails)
        self._seqs: dict[int, Sequence] = {}  # admitted sequences: their tail is indexed when they free
        self._copies: dict[int, tuple[int, int, int]] = {}  # seq id -> (source, its block, slots), not yet planned
        self._unwritten: set[int] = set()  # sequences whose copy has not run yet (no step applied since)
        self._pins: list[int] = []  # copy sources of the plan not yet applied (held until its step has run)
        self.on_block: Callable[[int], None] | None = None  # told each block handed out (KV page prefault)

    # ---- reading ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose KV is published for reuse (held by a sequence or evictable)."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Share of the pool held by sequences (cached blocks nobody holds count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, seq_id: int) -> list[int]:
        return self._tables.get(seq_id, [])

    def slot(self, seq_id: int, position: int) -> int:
        table = self._tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    # ---- prefix lookup ---------------------------------------------------------------------------
    def lookup(self, seq: Sequence) -> int:
        """Tokens at the start of a sequence not yet admitted whose KV is cached: whole blocks only, and
        always fewer than all its tokens (the last one must run to give logits). ``can_allocate`` and
        ``admit`` then count those blocks as reused. 0 when caching is off."""
        if not self.enable_prefix_caching or seq.seq_id in self._tables:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        chain: list[BlockHash] = []
        hits: list[int] = []
        while len(hits) < max_blocks:  # hash no further than the first miss: a cold prompt costs one hash
            block = self._cached.get(extend_chain(chain, seq, len(chain) + 1, self.block_size, self.model)[-1])
            if block is None:
                break
            hits.append(block)
        partial = self._partial_hit(seq, chain[len(hits) - 1] if hits else root_hash(self.model), len(hits))
        if partial is not None and self._hash[partial[0]] is not None \
                and self.blocks_needed(seq.num_tokens + 1) + 1 > self.num_blocks:
            # copying from a published block holds it until the copy has run: one block more than a request
            # that fills the pool can have, so it could never start (and held its class's queue for good)
            partial = None
        self._pending = (seq.seq_id, hits, chain, partial)
        return len(hits) * self.block_size + (partial[1] if partial is not None else 0)

    def _partial_hit(self, seq: Sequence, parent: BlockHash, num_hits: int) -> tuple[int, int] | None:
        """The indexed block after ``parent`` sharing the longest run of leading tokens with the sequence's
        next ones (at most all but its last token), as (block, tokens); None when none shares any."""
        start = num_hits * self.block_size
        limit = min(self.block_size, seq.num_tokens - 1 - start)
        if limit < 1:
            return None
        return self._index.longest(parent, seq.token_ids(start, start + limit))

    def _hits(self, seq_id: int) -> list[int]:
        pending = self._pending
        return pending[1] if pending is not None and pending[0] == seq_id else []

    def _partial(self, seq_id: int) -> tuple[int, int] | None:
        pending = self._pending
        return pending[3] if pending is not None and pending[0] == seq_id else None

    # ---- allocation ------------------------------------------------------------------------------
    def num_new_blocks(self, seq_id: int, num_tokens: int) -> int:
        """Blocks a sequence still needs so that ``num_tokens`` of its tokens have a slot (cached
        blocks found by ``lookup`` count as had)."""
        have = self._tables.get(seq_id) or self._hits(seq_id)
        return max(0, self.blocks_needed(num_tokens) - len(have))

    def pool_cost(self, seq_id: int, num_tokens: int) -> int:
        """Blocks the allocation takes out of the pool: new ones, plus reused ones nobody else holds
        (they stop being evictable), plus a partial hit's copy source while the copy is pending."""
        return self._pool_cost(seq_id, num_tokens)

    def _pool_cost(self, seq_id: int, num_tokens: int) -> int:
        """Blocks the allocation takes out of the pool: new ones, plus reused ones nobody else holds
        (they stop being evictable)."""
        cost = self.num_new_blocks(seq_id, num_tokens)
        if seq_id not in self._tables:
            cost += sum(1 for b in self._hits(seq_id) if self._ref[b] == 0)
            partial = self._partial(seq_id)
            if partial is not None and self._hash[partial[0]] is not None and self._ref[partial[0]] == 0:
                cost += 1  # a copy's source, held until the copy has run
        return cost

    def can_allocate(self, seq_id: int, num_tokens: int, reserve: int = 0) -> bool:
        return self._pool_cost(seq_id, num_tokens) + reserve <= self.num_free_blocks

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grow the sequence's table to cover ``num_tokens`` tokens; raises if the pool is short."""
        cost = self._pool_cost(seq_id, num_tokens)
        if cost > self.num_free_blocks:
            raise MemoryError(f"KV pool exhausted: need {cost} blocks, {self.num_free_blocks} free")
        table = self._tables.get(seq_id)
        if table is None:
            table = self._tables[seq_id] = self._take_hits(seq_id)
        for _ in range(self.num_new_blocks(seq_id, num_tokens)):
            block = self._take_block()
            self._ref[block] = 1
            table.append(block)
        return table

    def admit(self, seq: Sequence, num_new_tokens: int) -> int:
        """First allocation of a waiting sequence: reuse the cached prefix the last ``lookup`` found and
        add fresh blocks for ``num_new_tokens`` tokens after it; count the hit for the sequence's class.
        Returns the tokens reused, which become the sequence's ``num_computed_tokens``."""
        assert seq.seq_id not in self._tables, f"sequence {seq.seq_id} already holds blocks"
        num_full = len(self._hits(seq.seq_id))
        partial = self._partial(seq.seq_id)
        num_hit_tokens = num_full * self.block_size + (partial[1] if partial is not None else 0)
        if partial is not None:
            if partial[0] not in self._index:  # evicted since lookup(): a scheduler bug, never a wrong KV
                raise RuntimeError(f"block {partial[0]} sequence {seq.seq_id} reuses was evicted before admission")
            if self._hash[partial[0]] is not None:  # a published block: copied, so held until the copy has run
                self._pin(partial[0])  # before allocating: the source must not be the block evicted for it
        table = self.allocate(seq.seq_id, num_hit_tokens + num_new_tokens)
        if partial is not None and table[num_full] != partial[0]:
            self._copies[seq.seq_id] = (partial[0], table[num_full], partial[1])
            self._unwritten.add(seq.seq_id)
        if self.enable_prefix_caching:
            self._seqs[seq.seq_id] = seq
            if seq.num_preemptions == 0:
                self.stats.record(seq.class_name, seq.num_prompt_tokens, num_hit_tokens)
                seq.num_cached_prompt_tokens = num_hit_tokens  # the usage a client sees (cached_tokens)
        return num_hit_tokens

    def take_copy(self, seq_id: int) -> tuple[int, int, int] | None:
        """The copy a newly admitted sequence's first chunk needs before it runs: (source block, the
        sequence's block, slots); None when its cached prefix ended on a block boundary."""
        return self._copies.pop(seq_id, None)

    def release_pins(self) -> None:
        """The step of the last plan has run (a failed step's chunks have run again alone): its copy
        sources go back to the pool (the scheduler's update calls this first)."""
        for block in self._pins:
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._evictable[block] = None  # indexed (hashed or a tail): reusable, most recent
        self._pins = []

    def _pin(self, block: int) -> None:
        if self._ref[block] == 0:
            del self._evictable[block]
        self._ref[block] += 1
        self._pins.append(block)

    def _take_hits(self, seq_id: int) -> list[int]:
        if self._pending is None or self._pending[0] != seq_id:
            self._num_hashed[seq_id] = 0
            return []
        _, hits, chain, partial = self._pending
        self._pending = None
        self._chains[seq_id] = chain[:len(hits)]
        for i, block in enumerate(hits):
            if self._hash[block] != chain[i]:  # evicted since lookup(): a scheduler bug, never a wrong KV
                raise RuntimeError(f"cached block {block} of sequence {seq_id} was evicted before admission")
            if self._ref[block] == 0:
                del self._evictable[block]
            self._ref[block] += 1
        self._num_hashed[seq_id] = len(hits)
        table = list(hits)
        if partial is not None and self._hash[partial[0]] is None:
            tail = partial[0]  # a tail nobody holds: the sequence takes it over, its written slots and all
            self._index.remove(tail)
            del self._evictable[tail]
            self._ref[tail] = 1
            table.append(tail)
        return table

    def _take_block(self) -> int:
        if not self._free and not self.evict(1):
            raise MemoryError("KV pool exhausted")
        block = self._free.pop()
        if self.on_block is not None:
            self.on_block(block)
        return block

    def evict(self, num_blocks: int) -> int:
        """Drop up to ``num_blocks`` least recently used unreferenced cached blocks to the free list."""
        done = 0
        while done < num_blocks and self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._index.remove(block)
            h = self._hash[block]
            if h is not None:
                del self._cached[h]
                self._hash[block] = None
            self._free.append(block)
            self.stats.num_evictions += 1
            done += 1
        return done

    # ---- publishing and freeing ------------------------------------------------------------------
    def cache_blocks(self, seq: Sequence) -> None:
        """Publish the sequence's full blocks whose tokens have all been computed (call after a step)."""
        self._unwritten.discard(seq.seq_id)  # a step ran for it: its copy too
        if not self.enable_prefix_caching or seq.seq_id not in self._tables:
            return
        table = self._tables[seq.seq_id]
        num_full = min(seq.num_computed_tokens // self.block_size, len(table))
        start = self._num_hashed.get(seq.seq_id, 0)
        if num_full <= start:
            return
        chain = extend_chain(self._chains.setdefault(seq.seq_id, []), seq, num_full, self.block_size,
                             self.model)
        for i in range(start, num_full):
            block, h = table[i], chain[i]
            if self._hash[block] is None and h not in self._cached:  # an equal block cached first stays
                self._hash[block] = h
                self._cached[h] = block
                self._index.add(block, chain[i - 1] if i else root_hash(self.model),
                                seq.token_ids(i * self.block_size, (i + 1) * self.block_size))
        self._num_hashed[seq.seq_id] = num_full

    def free(self, seq_id: int) -> int:
        """Drop the sequence's references (finish, abort, preemption); returns the number of blocks.
        Hashed blocks nobody else holds become evictable, the sequence's last blocks least recent (a
        prefix's head is worth more than its tail); the others go back to the free list."""
        table = self._tables.pop(seq_id, [])
        chain = self._chains.pop(seq_id, None)
        num_hashed = self._num_hashed.pop(seq_id, 0)
        seq = self._seqs.pop(seq_id, None)
        self._copies.pop(seq_id, None)
        if self._pending is not None and self._pending[0] == seq_id:
            self._pending = None
        if seq is not None and seq_id not in self._unwritten and num_hashed < len(table):
            self._index_tail(seq, table[num_hashed], chain[num_hashed - 1] if chain and num_hashed else None,
                             num_hashed)
        self._unwritten.discard(seq_id)
        for block in reversed(table):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                if self._hash[block] is not None or block in self._index:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        return len(table)

    def _index_tail(self, seq: Sequence, block: int, parent: BlockHash | None, index: int) -> None:
        """Index the partly written block after a freed sequence's hashed ones, if a step wrote any of it."""
        start = index * self.block_size
        written = min(seq.num_computed_tokens, seq.num_tokens) - start
        if written <= 0 or self._hash[block] is not None or block in self._index:
            return
        self._index.add(block, parent if parent is not None else root_hash(self.model),
                        seq.token_ids(start, start + min(written, self.block_size)))

    def check_conserved(self) -> None:
        """Every block is free, evictable, or referenced exactly as often as tables hold it; the hash
        index and the blocks agree (tests call this after each step)."""
        held: dict[int, int] = {}
        for b in self._pins:  # a copy source is held by its plan
            held[b] = held.get(b, 0) + 1
        for table in self._tables.values():
            if len(set(table)) != len(table):
                raise AssertionError(f"a block twice in one table: {table}")
            for b in table:
                held[b] = held.get(b, 0) + 1
        free, evictable = set(self._free), set(self._evictable)
        parts = [set(held), free, evictable]
        if len(free) != len(self._free) or sum(map(len, parts)) != self.num_blocks \
                or set().union(*parts) != set(range(self.num_blocks)):
            raise AssertionError(f"blocks not conserved: {len(held)} held + {len(self._free)} free + "
                                 f"{len(evictable)} evictable != {self.num_blocks}")
        for b in range(self.num_blocks):
            if self._ref[b] != held.get(b, 0):
                raise AssertionError(f"block {b}: ref count {self._ref[b]}, held by {held.get(b, 0)} tables and plans")
        if any(self._hash[b] is not None or b in self._index for b in free) \
                or any(self._hash[b] is None and b not in self._index for b in evictable):
            raise AssertionError("a free block keeps a hash or an index entry, or an evictable block has neither")
        self._index.check()
        if any(self._hash[b] is not None and b not in self._index for b in range(self.num_blocks)):
            raise AssertionError("a hashed block is missing from the token index")
        if any(self._hash[b] != h for h, b in self._cached.items()) \
                or sum(h is not None for h in self._hash) != len(self._cached):
            raise AssertionError("the hash index and the blocks' hashes disagree")
