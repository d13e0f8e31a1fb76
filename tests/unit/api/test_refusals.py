"""The refusals that used to be a 500, a silent clamp or an answer of ``null`` are 400s naming the
field, decided in the API before anything is queued (the model-backed versions are in
tests/integration/api/test_web_pages_server.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from homeai.api.admission import LLMRequest, PromptFields, max_tokens_of
from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import FunctionTool, ResponseFormat
from homeai.api.routing import HEADER_PRIORITY, check_priority
from homeai.api.schema_rules import endless_ref, unenforced_keyword
from homeai.api.structured import ollama_format_constraint, response_format_constraint
from homeai.api.tools import parse_tools
from homeai.core.block_manager import BlockManager
from homeai.core.types import SamplingParams
from homeai.gateway.gateway import Route
from homeai.policy.loader import load_policy

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def fake_gateway(max_model_len: int = 2048, kv_blocks: int = 256) -> Any:
    engine = SimpleNamespace(max_model_len=max_model_len,
                             scheduler=SimpleNamespace(block_manager=BlockManager(kv_blocks, 16)))
    return SimpleNamespace(policy=load_policy(DEFAULT_POLICY), llm=lambda model: engine)


def test_priority_must_be_one_of_the_class_levels() -> None:
    """Before: -1 raised ValueError in the class queue (a 500); 99 queued at the lowest level."""
    gateway = fake_gateway()
    chat = Route("smollm2-135m-instruct", "chat")  # priority_levels: 2 in the default policy
    for level in (None, 1, 2):
        check_priority(gateway, chat, level)
    for level in (-1, 0, 3, 99):
        with pytest.raises(BadRequest) as refused:
            check_priority(gateway, chat, level)
        assert refused.value.param == HEADER_PRIORITY and "from 1 to 2" in refused.value.message


def request(max_tokens: int | None, prompt_field: str = "messages", limit_field: str = "max_tokens") -> LLMRequest:
    return LLMRequest("smollm2-135m-instruct", "chat", SamplingParams(), max_tokens,
                      fields=PromptFields(prompt_field, limit_field))


def test_a_prompt_too_long_names_its_field() -> None:
    gateway, route = fake_gateway(max_model_len=2048, kv_blocks=64), Route("smollm2-135m-instruct", "chat")
    engine, cp = gateway.llm(route.model), gateway.policy.classes[route.class_name]

    def limit(prompt: list[int], req: LLMRequest) -> int:
        return max_tokens_of(engine, cp, route, prompt, req)

    assert limit(list(range(100)), request(100)) == 100
    for n, field in ((2048, "messages"), (3000, "prompt"), (0, "input")):
        with pytest.raises(BadRequest) as refused:
            limit(list(range(n)), request(16, field))
        assert refused.value.param == field
    with pytest.raises(BadRequest) as refused:  # the KV cache (64 x 16 tokens) holds the prompt, not the answer
        limit(list(range(1000)), request(1000, "messages", "max_completion_tokens"))
    assert refused.value.param == "max_completion_tokens"
    # unset: as much as the context and the KV cache leave (never a 400 for a small cache)
    assert limit(list(range(1000)), request(None)) == 64 * 16 - 1000


def json_schema(schema: Any) -> ResponseFormat:
    return msgspec.convert({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, ResponseFormat)


def test_schema_keywords_the_grammar_drops_are_refused() -> None:
    """Before: {"not": {}} (nothing satisfies it) compiled to "any JSON" and the model answered null."""
    with pytest.raises(BadRequest) as refused:
        response_format_constraint(json_schema({"not": {}}))
    assert refused.value.param == "response_format.json_schema.schema" and "'not'" in refused.value.message
    with pytest.raises(BadRequest) as refused:
        ollama_format_constraint({"type": "object", "properties": {"a": {"if": {"type": "string"}}}})
    assert refused.value.param == "format" and "properties.a.if" in refused.value.message
    assert unenforced_keyword({"type": "array", "items": [{"type": "string"}, {"not": {"type": "null"}}]}) \
        == "items[1].not"
    nested = {"anyOf": [{"type": "string"}, {"$defs": {"x": {"else": {}}}}]}
    assert unenforced_keyword(nested) == "anyOf[1].$defs.x.else"
    # a property named "not", and data that holds the word, are fine
    fine = {"type": "object", "properties": {"not": {"type": "string"}}, "enum": [{"not": 1}], "const": {"if": 2}}
    assert unenforced_keyword(fine) is None
    assert response_format_constraint(json_schema(fine))


def test_a_schema_that_requires_itself_without_end_is_refused() -> None:
    """No finite JSON matches such a schema, and the grammar's forced text from it never ends: xgrammar
    built it until the server ran out of memory (21 GB in a minute). Recursion with a way out is fine."""
    endless = [
        {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        {"$defs": {"node": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/node"}}},
         "$ref": "#/$defs/node"},
        {"$defs": {"x": {"allOf": [{"$ref": "#/$defs/y"}]}, "y": {"anyOf": [{"$ref": "#/$defs/x"}]}},
         "$ref": "#/$defs/x"},
    ]
    for schema in endless:
        with pytest.raises(BadRequest) as refused:
            response_format_constraint(json_schema(schema))
        assert refused.value.param == "response_format.json_schema.schema"
        assert "requires itself" in refused.value.message
        with pytest.raises(BadRequest) as refused:
            ollama_format_constraint(schema)
        assert refused.value.param == "format"
    finite = [
        {"type": "object", "properties": {"name": {"type": "string"},
                                          "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["name"]},
        {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]},
        {"type": "object", "properties": {"a": {"$ref": "#"}}},  # optional
    ]
    for schema in finite:
        assert endless_ref(schema) is None
        assert response_format_constraint(json_schema(schema))
    chain = {"$defs": {f"d{i}": {"type": "object", "properties": {"n": {"$ref": f"#/$defs/d{i + 1}"}},
                                 "required": ["n"]} for i in range(5000)}, "$ref": "#/$defs/d0"}
    chain["$defs"]["d5000"] = {"type": "integer"}
    with pytest.raises(BadRequest) as refused:  # a RecursionError (a 500) before
        response_format_constraint(json_schema(chain))
    assert refused.value.param == "response_format.json_schema.schema"


def test_tool_parameters_get_the_same_schema_refusals() -> None:
    """A tool's arguments are generated under its parameters' schema: a keyword the grammar drops let a call
    break its schema ({"not": {"enum": ["kitchen"]}} answered "kitchen"), an endless one took the server."""
    def tools(parameters: dict[str, Any]) -> list[FunctionTool]:
        return msgspec.convert([{"type": "function", "function": {"name": "HassTurnOn", "parameters": parameters}}],
                               list[FunctionTool])

    with pytest.raises(BadRequest) as refused:
        parse_tools(tools({"type": "object", "properties": {"room": {"type": "string", "not": {"enum": ["kitchen"]}}}}))
    assert refused.value.param == "tools[0].function.parameters" and "properties.room.not" in refused.value.message
    with pytest.raises(BadRequest) as refused:
        parse_tools(tools({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}))
    assert refused.value.param == "tools[0].function.parameters"
    assert parse_tools(tools({"type": "object", "properties": {"room": {"type": "string"}}}))[0].name == "HassTurnOn"
