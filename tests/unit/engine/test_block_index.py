"""The token index the prefix cache finds a prefix ending inside a block with."""

from __future__ import annotations

from homeai.core.block_index import BlockIndex

A, B = b"parent-a", b"parent-b"


def test_the_longest_shared_run_wins_and_among_equals_the_latest() -> None:
    index = BlockIndex()
    index.add(1, A, [5, 6, 7, 8])
    index.add(2, A, [5, 6, 9])
    index.add(3, A, [5, 6, 7])
    index.add(4, B, [5, 6, 7, 8])  # another parent: another prefix, never found under A
    assert index.longest(A, [5, 6, 7, 1]) == (3, 3)  # 1 and 3 share three tokens: 3 was indexed last
    assert index.longest(A, [5, 6, 7, 8]) == (1, 4)
    assert index.longest(A, [5, 6, 2]) == (3, 2)
    assert index.longest(A, [6]) is None and index.longest(b"none", [5]) is None
    index.check()


def test_a_removed_block_is_never_found_and_its_empty_branches_go() -> None:
    index = BlockIndex()
    index.add(1, A, [5, 6, 7, 8])
    index.add(2, A, [5, 9])
    index.remove(1)
    assert 1 not in index and index.blocks() == {2}
    assert index.longest(A, [5, 6, 7, 8]) == (2, 1)
    index.remove(2)
    index.remove(2)  # twice: nothing
    assert index.longest(A, [5]) is None and not index._roots
    index.check()
