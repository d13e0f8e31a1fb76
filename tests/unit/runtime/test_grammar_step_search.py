"""Near the end of its budget a constrained row searches for closings on the device thread the whole batch
shares: a step's searches are bounded (``CLOSING_STEP_BYTES``) whatever the schema (found by a review: 20
required strings of at least 50 characters with max_tokens 700 held steps for up to ~1 s each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from homeai.core.types import Constraint, ConstraintKind
from homeai.engine.builder import load_tokenizer
from homeai.runtime.grammar import CLOSING_SEARCH_BYTES, CLOSING_STEP_BYTES, GrammarCache, SequenceGrammars

EOS = 2  # SmolLM2's <|im_end|>
LONG_STRINGS = {"type": "object", "additionalProperties": False, "required": [f"k{i}" for i in range(6)],
                "properties": {f"k{i}": {"type": "string", "minLength": 30} for i in range(6)}}


@pytest.fixture(scope="module")
def tokenizer(pulled_models: dict[str, Path]) -> PreTrainedTokenizerBase:
    return load_tokenizer(pulled_models["smollm2-135m-instruct"])


def test_a_rows_closing_searches_are_bounded_each_step(tokenizer: PreTrainedTokenizerBase) -> None:
    cache = GrammarCache(tokenizer, len(tokenizer), [EOS])
    searched: list[int] = []
    real = cache.closer.closing

    def counting(matcher: Any, limit: int = CLOSING_SEARCH_BYTES, shortest: bool = False) -> list[int] | None:
        searched.append(limit)
        return real(matcher, limit, shortest)

    cache.closer.closing = counting  # type: ignore[method-assign]
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(LONG_STRINGS))
    grammars, rng, out = SequenceGrammars(cache), torch.Generator().manual_seed(0), []
    max_tokens, worst = 200, 0
    while len(out) < max_tokens:
        logits = torch.randn(1, cache.vocab_size, generator=rng)
        searched.clear()
        mask = grammars.fill([7], [constraint], [out], [max_tokens - len(out)], lambda row, s=logits: s[row])
        worst = max(worst, sum(searched))
        xgr.apply_token_bitmask_inplace(logits, mask)
        out.append(int(logits.argmax()))
        if out[-1] == EOS:
            break
        grammars.advance(7, out[-1])
    assert worst <= CLOSING_STEP_BYTES + CLOSING_SEARCH_BYTES, worst  # a row's own closing, then the candidates'
    assert out[-1] == EOS and len(out) <= max_tokens
    jsonschema.validate(json.loads(tokenizer.decode(out[:-1])), LONG_STRINGS)  # still complete, in time
