"""What a review found in the grammar cache and the closer (homeai/runtime/grammar.py): xgrammar's own
compiler cache grew without bound under ours; a choice only between non-ASCII characters had no closing;
a closing too long to find from the start was never looked for again; a forced text too big to build was
a 500. The "model" is the adversary of test_grammar_budget.py: the best allowed token of random logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import xgrammar as xgr
from grammar_helpers import EOS, decode_row
from transformers import PreTrainedTokenizerBase

from homeai.core.types import Constraint, ConstraintKind
from homeai.engine.builder import load_tokenizer
from homeai.runtime.grammar import GrammarCache, GrammarError


@pytest.fixture(scope="module")
def tokenizer(pulled_models: dict[str, Path]) -> PreTrainedTokenizerBase:
    return load_tokenizer(pulled_models["smollm2-135m-instruct"])


@pytest.fixture(scope="module")
def cache(tokenizer: PreTrainedTokenizerBase) -> GrammarCache:
    return GrammarCache(tokenizer, len(tokenizer), [EOS])


def schema_constraint(schema: dict[str, Any]) -> Constraint:
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema, sort_keys=True))


def test_the_compiler_keeps_no_cache_of_its_own(cache: GrammarCache) -> None:
    """Before: xgrammar cached every compiled grammar too, with no bound, under our 128-entry LRU."""
    for i in range(3):
        cache.compile(schema_constraint({"type": "object", "properties": {f"k{i}": {"type": "integer"}}}))
    assert cache._compiler.get_cache_size_bytes() == 0


@pytest.mark.parametrize("room", [{"enum": ["客厅", "卧室"]}, {"enum": ["é", "è"]},
                                  {"type": "string", "pattern": "^[α-ω]+$"}])
def test_a_choice_between_non_ascii_characters_has_a_closing(cache: GrammarCache, tokenizer: PreTrainedTokenizerBase,
                                                             room: dict[str, Any]) -> None:
    """Before: no closing (the first byte of a non-ASCII character was never tried): min_output_tokens
    None, and every row of the constraint sampled freely to its budget."""
    schema = {"type": "object", "properties": {"room": room}, "required": ["room"]}
    constraint = schema_constraint(schema)
    closing = cache.initial_closing(constraint)
    assert closing is not None and cache.min_output_tokens(constraint) == len(closing) + 1
    matcher = xgr.GrammarMatcher(cache.compile(constraint))
    assert all(matcher.accept_token(t) for t in closing) and matcher.is_completed()
    jsonschema.validate(json.loads(tokenizer.decode(closing)), schema)
    tokens, _ = decode_row(cache, constraint, len(closing) + 1, 0)
    assert tokens[-1] == EOS
    jsonschema.validate(json.loads(tokenizer.decode(tokens[:-1])), schema)


def test_a_closing_too_long_to_find_at_the_start_is_looked_for_near_the_budget(
        cache: GrammarCache, tokenizer: PreTrainedTokenizerBase) -> None:
    """A forced text past the search limit, then an unbounded string: from the start no closing is found;
    once the forced text is written, '"}' closes. Before: the row was hopeless for good, and cut."""
    schema = {"type": "object", "properties": {"a": {"const": "kitchen light " * 150}, "b": {"type": "string"}},
              "required": ["a", "b"], "additionalProperties": False}
    constraint = schema_constraint(schema)
    assert cache.min_output_tokens(constraint) is None
    for seed, budget in enumerate((900, 1100)):
        tokens, _ = decode_row(cache, constraint, budget, seed)
        assert tokens[-1] == EOS and len(tokens) <= budget
        jsonschema.validate(json.loads(tokenizer.decode(tokens[:-1])), schema)


def test_a_forced_text_too_big_to_build_is_a_grammar_error(tokenizer: PreTrainedTokenizerBase,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """xgrammar raises std::bad_alloc as a RuntimeError while it builds a forced text: a 400, not a 500."""
    cache = GrammarCache(tokenizer, len(tokenizer), [EOS])

    def out_of_memory(*_: Any, **__: Any) -> None:
        raise RuntimeError("std::bad_alloc")

    monkeypatch.setattr(cache.closer, "closing", out_of_memory)
    with pytest.raises(GrammarError, match="bad_alloc"):
        cache.min_output_tokens(schema_constraint({"type": "array", "items": {"type": "null"}, "minItems": 9}))
