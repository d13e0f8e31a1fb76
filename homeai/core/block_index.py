"""Finds, among KV blocks whose leading tokens are written, the one sharing the longest run of leading
tokens with a prompt, after a given prefix: how the block manager reuses a prefix that ends inside a block.

Per parent (the hash of the full blocks before), a trie of the blocks' tokens: a node at depth d holds
every block whose first d tokens lead there, so a lookup walks as many nodes as the run it finds is long
(at most a block's size) however many blocks are indexed; a scan of every block after the parent cost
~250 us per lookup with 1,200 of them, each sharing a chat template's first tokens.
"""

from __future__ import annotations

from homeai.core.block_hash import BlockHash


class _Node:
    __slots__ = ("blocks", "next")

    def __init__(self) -> None:
        self.next: dict[int, _Node] = {}
        self.blocks: dict[int, None] = {}  # blocks whose leading tokens lead here, oldest first


class BlockIndex:
    """Blocks by (parent hash, leading tokens). A block is indexed once (``add``) until ``remove``."""

    def __init__(self) -> None:
        self._roots: dict[BlockHash, _Node] = {}
        self._entries: dict[int, tuple[BlockHash, tuple[int, ...]]] = {}

    def __contains__(self, block: int) -> bool:
        return block in self._entries

    def blocks(self) -> set[int]:
        return set(self._entries)

    def add(self, block: int, parent: BlockHash, tokens: list[int]) -> None:
        node = self._roots.setdefault(parent, _Node())
        for token in tokens:
            node = node.next.setdefault(token, _Node())
            node.blocks[block] = None
        self._entries[block] = (parent, tuple(tokens))

    def remove(self, block: int) -> None:
        entry = self._entries.pop(block, None)
        if entry is None:
            return
        parent, tokens = entry
        path = [self._roots[parent]]
        for token in tokens:
            path.append(path[-1].next[token])
            del path[-1].blocks[block]
        # A node's blocks include all of its children's: an emptied node has an empty subtree.
        for depth in range(len(tokens), 0, -1):
            if path[depth].blocks:
                break
            del path[depth - 1].next[tokens[depth - 1]]
        if not path[0].next:
            del self._roots[parent]

    def longest(self, parent: BlockHash, tokens: list[int]) -> tuple[int, int] | None:
        """(block, n): the most recently indexed block after ``parent`` whose first n tokens are the first
        n of ``tokens``, for the largest n; None when no block after ``parent`` starts with tokens[0]."""
        node = self._roots.get(parent)
        found, depth = None, 0
        for token in tokens:
            if node is None or (node := node.next.get(token)) is None:
                break
            found, depth = node, depth + 1
        if found is None:
            return None
        return next(reversed(found.blocks)), depth

    def check(self) -> None:
        """The trie holds exactly the indexed blocks, each along its own tokens (tests)."""
        seen: set[int] = set()
        for parent, root in self._roots.items():
            for token, child in root.next.items():
                for block in child.blocks:
                    entry = self._entries.get(block)
                    if entry is None or entry[0] != parent or entry[1][0] != token:
                        raise AssertionError(f"block {block} is in the trie under the wrong tokens")
                seen |= child.blocks.keys()
        if seen != set(self._entries):
            raise AssertionError("the token index and the trie disagree")
