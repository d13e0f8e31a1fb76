"""Names a full KV block by everything its keys and values depend on: the hash of the block before it,
its own token ids, and the model.

Chaining makes a block's hash cover the whole prefix up to its last token, so two sequences with equal
hashes for block i have equal keys and values in blocks 0..i (as in vLLM v1). SHA-256 rather than
Python's ``hash``: a collision would hand one household member another's cached context.
"""

from __future__ import annotations

import hashlib
from array import array

from homeai.core.sequence import Sequence

BlockHash = bytes


def root_hash(model: str) -> BlockHash:
    """The parent of a sequence's first block: differs per model, so caches of two models never meet."""
    return hashlib.sha256(b"homeai-kv-root\0" + model.encode()).digest()


def block_hash(parent: BlockHash, token_ids: list[int], model: str) -> BlockHash:
    h = hashlib.sha256(parent)
    h.update(model.encode())
    h.update(b"\0")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def extend_chain(chain: list[BlockHash], seq: Sequence, num_blocks: int, block_size: int,
                 model: str) -> list[BlockHash]:
    """Grow ``chain`` (hashes of the sequence's first full blocks) to ``num_blocks`` entries, in place.

    Tokens of a full block never change (a sequence only appends), so a chain computed once stays valid.
    """
    parent = chain[-1] if chain else root_hash(model)
    for i in range(len(chain), num_blocks):
        parent = block_hash(parent, seq.token_ids(i * block_size, (i + 1) * block_size), model)
        chain.append(parent)
    return chain
