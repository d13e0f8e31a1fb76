"""Near the end of its budget a constrained row searches for closings on the device thread the whole batch
shares: a step's searches are bounded (``CLOSING_STEP_BYTES``) whatever the schema (found by a review: 20
required strings of at least 50 characters with max_tokens 700 held steps for up to ~1 s each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grammar_helpers import EOS, decode_row
from transformers import PreTrainedTokenizerBase

from homeai.core.types import Constraint, ConstraintKind
from homeai.engine.builder import load_tokenizer
from homeai.runtime.grammar import CLOSING_SEARCH_BYTES, CLOSING_STEP_BYTES, GrammarCache

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
    per_step: list[int] = []

    def next_step() -> None:  # what the step before searched
        per_step.append(sum(searched))
        searched.clear()

    max_tokens = 200
    out, _ = decode_row(cache, constraint, max_tokens, 0, before_fill=next_step)
    worst = max([*per_step, sum(searched)])
    assert worst <= CLOSING_STEP_BYTES + CLOSING_SEARCH_BYTES, worst  # a row's own closing, then the candidates'
    assert out[-1] == EOS and len(out) <= max_tokens
    jsonschema.validate(json.loads(tokenizer.decode(out[:-1])), LONG_STRINGS)  # still complete, in time
