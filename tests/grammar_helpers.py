"""One constrained row decoded the way the runner does (fill with its budget, sample under the mask,
advance), against random logits: a model that wants whatever the grammar lets through."""

from __future__ import annotations

from collections.abc import Callable

import torch
import xgrammar as xgr

from homeai.core.types import Constraint
from homeai.runtime.grammar import GrammarCache, SequenceGrammars

EOS = 2  # SmolLM2's <|im_end|>


def decode_row(cache: GrammarCache, constraint: Constraint, max_tokens: int, seed: int, budgets: bool = True,
               before_fill: Callable[[], None] | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """The row's tokens (ending with EOS when it closed) and each step's mask; ``budgets``: the row's budget
    goes to ``fill``; ``before_fill``: called before each step's fill."""
    grammars, rng = SequenceGrammars(cache), torch.Generator().manual_seed(seed)
    out: list[int] = []
    masks = []
    while len(out) < max_tokens:
        logits = torch.randn(1, cache.vocab_size, generator=rng)
        if before_fill is not None:
            before_fill()
        mask = grammars.fill([7], [constraint], [out], [max_tokens - len(out)] if budgets else None,
                             lambda row, scores=logits: scores[row])
        masks.append(mask.clone())
        xgr.apply_token_bitmask_inplace(logits, mask)
        out.append(int(logits.argmax()))
        if out[-1] == EOS:
            break
        grammars.advance(7, out[-1])
    return out, masks
