"""Constrained output closes within its budget (homeai/runtime/grammar.py), whatever the model wants.

The "model" here is adversarial: each step it takes the best allowed token of random logits, so it
writes strings of random words that no schema bounds and would run past any budget. Through
``SequenceGrammars`` with each row's budget, every output still ends complete, with its end token,
within ``max_tokens`` from the shortest budget that can hold it upwards; a row far from its budget
is never narrowed.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
import pytest
import torch
import xgrammar as xgr
from grammar_helpers import EOS, decode_row
from transformers import PreTrainedTokenizerBase

from homeai.api.openai_schemas import FunctionTool
from homeai.api.tool_calls import parse_all
from homeai.api.tools import parse_tools, plan_tools
from homeai.bench.constrained_bench import LONG_ARRAY
from homeai.core.types import Constraint, ConstraintKind
from homeai.engine.builder import load_tokenizer
from homeai.runtime.grammar import CLOSING_WINDOW, GrammarCache, SequenceGrammars

LIGHT = {"type": "object", "additionalProperties": False, "required": ["name"],
         "properties": {"name": {"type": "string", "maxLength": 24},
                        "area": {"type": "string", "enum": ["kitchen", "hall", "bedroom"]}}}
SET = {"type": "object", "additionalProperties": False, "required": ["name", "brightness"],  # name: no bound
       "properties": {"name": {"type": "string"}, "brightness": {"type": "integer", "minimum": 0, "maximum": 100}}}
NESTED = {"type": "object", "required": ["items", "note"], "properties": {
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["id", "tags"], "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}}},
    "note": {"type": "string"}, "kind": {"enum": ["alpha", "beta"]}}}
TOOLS = parse_tools(msgspec.convert(
    [{"type": "function", "function": {"name": n, "parameters": p}}
     for n, p in (("HassTurnOn", LIGHT), ("HassTurnOff", LIGHT), ("HassLightSet", SET))], list[FunctionTool]))
SCHEMAS = {t.name: t.parameters for t in TOOLS}
CONSTRAINTS = {
    "required": plan_tools(TOOLS, "required", None).constraint(),
    "named": plan_tools(TOOLS, {"type": "function", "function": {"name": "HassLightSet"}}, None).constraint(),
    "json_object": Constraint(ConstraintKind.JSON_OBJECT, ""),
    "json_schema": Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(NESTED)),
}


@pytest.fixture(scope="module")
def tokenizer(pulled_models: dict[str, Path]) -> PreTrainedTokenizerBase:
    return load_tokenizer(pulled_models["smollm2-135m-instruct"])


@pytest.fixture(scope="module")
def cache(tokenizer: PreTrainedTokenizerBase) -> GrammarCache:
    return GrammarCache(tokenizer, len(tokenizer), [EOS])


def check(tokenizer: PreTrainedTokenizerBase, name: str, tokens: list[int]) -> None:
    decoded = tokenizer.decode(tokens[:-1])
    if name in ("required", "named"):
        content, calls = parse_all(decoded)
        assert content == "" and len(calls) == 1, decoded
        assert name == "required" or calls[0].name == "HassLightSet"
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    elif name == "json_schema":
        jsonschema.validate(json.loads(decoded), NESTED)
    else:
        assert isinstance(json.loads(decoded), dict)


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_every_budget_that_can_hold_the_output_gets_it_complete(cache: GrammarCache, name: str,
                                                                tokenizer: PreTrainedTokenizerBase) -> None:
    constraint = CONSTRAINTS[name]
    shortest = cache.min_output_tokens(constraint)
    assert shortest is not None and shortest >= 2
    for seed, extra in enumerate((0, 0, 1, 2, 3, 5, 7, 10, 12, 16, 20, 25, 30, 45, 60)):
        tokens, _ = decode_row(cache, constraint, shortest + extra, seed)
        assert tokens[-1] == EOS and len(tokens) <= shortest + extra, (name, extra)
        check(tokenizer, name, tokens)


def test_without_budgets_the_same_model_runs_past_its_end(cache: GrammarCache) -> None:
    """The adversary is real: left free, it writes until the budget cuts it."""
    tokens, _ = decode_row(cache, CONSTRAINTS["named"], 48, 0, budgets=False)
    assert len(tokens) == 48 and tokens[-1] != EOS


def test_a_row_far_from_its_budget_is_never_narrowed(cache: GrammarCache) -> None:
    constraint = plan_tools(TOOLS[:2], "required", None).constraint()  # names of at most 24 characters
    assert constraint is not None
    for seed in range(3):
        tokens, masks = decode_row(cache, constraint, 400, seed)
        grammars = SequenceGrammars(cache)
        assert tokens[-1] == EOS and len(tokens) + CLOSING_WINDOW < 400
        for step, mask in enumerate(masks):  # the plain grammar's mask of the same prefix
            assert torch.equal(mask, grammars.fill([seed], [constraint], [tokens[:step]])), step
            grammars.reset(seed)


def test_shortest_outputs_and_closings_are_what_the_grammar_accepts(cache: GrammarCache,
                                                                     tokenizer: PreTrainedTokenizerBase) -> None:
    closing = cache.initial_closing(CONSTRAINTS["named"])
    assert closing is not None
    call = parse_all(tokenizer.decode(closing))[1]
    assert [(c.name, json.loads(c.arguments)) for c in call] == [("HassLightSet", {"brightness": 0, "name": ""})]
    matcher = xgr.GrammarMatcher(cache.compile(CONSTRAINTS["named"]))
    assert all(matcher.accept_token(t) for t in closing) and matcher.is_completed()
    assert cache.min_output_tokens(CONSTRAINTS["named"]) == len(closing) + 1
    shortest_call = cache.initial_closing(CONSTRAINTS["required"])
    assert shortest_call is not None and len(shortest_call) <= len(closing)  # TurnOn/Off: fewer fields
    assert cache.min_output_tokens(CONSTRAINTS["json_object"]) == 2  # "{}" and the end
    assert cache.min_output_tokens(plan_tools(TOOLS, "auto", None).constraint()) == 1  # text may end at once


def test_an_output_no_budget_can_hold_costs_one_search(cache: GrammarCache) -> None:
    """The constrained bench's array of 10 000 integers: no closing is looked for beyond the search
    limit, so the row samples freely (and is cut) without a search every step."""
    assert cache.min_output_tokens(LONG_ARRAY) is None
    tokens, _ = decode_row(cache, LONG_ARRAY, 24, 0)
    assert len(tokens) == 24 and EOS not in tokens
