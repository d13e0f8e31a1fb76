"""What a review found in structured output and tool calls (homeai/api/structured.py, tools.py, tool_calls.py).

A schema the grammar (xgrammar 0.2.9, strict, compact) would follow only in part is a 400 naming the field
and the keyword's path: each refused schema here is shown to be broken by the grammar (it accepts a value
the schema refuses), and the schemas clients send (OpenAI's structured-output examples, pydantic models,
Home Assistant's tools, optional fields) still pass and are shown to be enforced. A short schema that forces
huge text is a 400 too; a tool's parameters must describe an object; a lone "<" ending an answer is text.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import msgspec
import pytest
import xgrammar as xgr

from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import FunctionTool, ResponseFormat, ResponsesFunctionTool
from homeai.api.schema_rules import MAX_REPEAT, regex_weight
from homeai.api.structured import response_format_constraint
from homeai.api.tool_calls import ToolCallParser, parse_all
from homeai.api.tools import parse_tools

AB = {"a": {"type": "integer"}, "b": {"type": "integer"}}
# (schema, where the 400 points, a value the grammar lets through though the schema refuses it)
MIS_ENFORCED: list[tuple[dict[str, Any], str, str]] = [
    ({"type": "object", "properties": AB, "required": ["a"], "anyOf": [{"required": ["b"]}]}, "anyOf", '{"b": 1}'),
    ({"$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer"}}}}, "$ref": "#/$defs/A",
      "required": ["a"]}, "$ref", "{}"),
    ({"$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}, "minimum": 3}, "$ref", "1"),
    ({"type": "object", "properties": AB, "required": ["a"],
      "allOf": [{"type": "object", "properties": AB, "required": ["b"]}]}, "allOf", '{"b": 1}'),
    ({"allOf": [{"type": "object", "properties": AB, "required": ["a"]},
                {"type": "object", "properties": AB, "required": ["b"]}]}, "allOf", '{"a": 1}'),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf", "1"),
    ({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b"]}]}, "oneOf", '"b"'),
    ({"type": "object", "properties": AB, "required": ["a"], "oneOf": [{"required": ["a"]}, {"type": "object"}]},
     "oneOf", '{"b": 1}'),
    ({"enum": [1, "x"], "type": "string"}, "enum", "1"),
    ({"const": 1, "type": "string"}, "const", "1"),
    ({"type": "object", "properties": AB, "anyOf": [{"type": "string"}]}, "anyOf", '"a"'),
    ({"type": "object", "properties": {"room": {"type": "string", "anyOf": [{"minLength": 2}, {"maxLength": 0}]}}},
     "properties.room.anyOf", '{"room": "x"}'),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems", "[1, 1]"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}}, "contains", "[1]"),
    ({"type": "object", "properties": AB, "dependentRequired": {"a": ["b"]}}, "dependentRequired", '{"a": 1}'),
    ({"type": "object", "properties": AB, "dependentSchemas": {"a": {"required": ["b"]}}}, "dependentSchemas",
     '{"a": 1}'),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf", "1.2"),
    ({"type": "integer", "enum": [1, 2], "minimum": 2}, "enum", "1"),
    ({"minimum": 2}, "minimum", "0"),  # a keyword of one type where no type is given
    ({"type": "object", "properties": {"n": {"maxLength": 1}}}, "properties.n.maxLength", '{"n": "ab"}'),
    ({"anyOf": [{"type": "integer"}, {"minLength": 2}]}, "anyOf[1].minLength", '"a"'),
    ({"type": "object", "properties": AB, "required": ["a", "c"], "additionalProperties": True}, "required",
     '{"a": 1}'),
    ({"type": "object", "properties": AB, "additionalProperties": True,
      "patternProperties": {"^c": {"type": "integer"}}}, "patternProperties", '{"c": "s"}'),
    ({"type": "object", "properties": AB, "patternProperties": {"^b": {"type": "string"}}}, "patternProperties",
     '{"b": "s"}'),  # "b" must be an integer and a string: nothing matches
    ({"type": "string", "pattern": "^a+$", "maxLength": 2}, "maxLength", '"aaa"'),
    ({"type": "string", "format": "uuid", "minLength": 40}, "minLength", '"123e4567-e89b-12d3-a456-426614174000"'),
    ({"type": "integer", "minimum": 0, "multipleOf": 2}, "multipleOf", "1"),
    ({"type": "integer", "minimum": -10**6, "maximum": 10**6, "multipleOf": 7}, "multipleOf", "10"),
]

PET = {  # pydantic 2's schema of a model with a discriminated union, an enum, optional fields, a union
    "$defs": {"Cat": {"properties": {"kind": {"const": "cat", "title": "Kind", "type": "string"},
                                     "lives": {"maximum": 9, "minimum": 0, "title": "Lives", "type": "integer"}},
                      "required": ["kind", "lives"], "title": "Cat", "type": "object"},
              "Dog": {"properties": {"kind": {"const": "dog", "title": "Kind", "type": "string"},
                                     "good": {"title": "Good", "type": "boolean"}},
                      "required": ["kind", "good"], "title": "Dog", "type": "object"},
              "Color": {"enum": ["red", "blue"], "title": "Color", "type": "string"}},
    "properties": {"pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"},
                                             "propertyName": "kind"},
                           "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"},
                   "either": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Either"},
                   "color": {"$ref": "#/$defs/Color", "default": "red"},
                   "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Nick"},
                   "age": {"anyOf": [{"minimum": 0, "type": "integer"}, {"type": "null"}], "default": None}},
    "required": ["pet", "either"], "title": "Owner", "type": "object"}
STEP = {"type": "object", "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
        "required": ["explanation", "output"], "additionalProperties": False}
UI = {"type": "object", "properties": {  # OpenAI's recursive UI example
    "type": {"type": "string", "enum": ["div", "button", "header", "section", "field", "form"]},
    "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}},
    "attributes": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "value": {"type": "string"}}, "required": ["name", "value"],
        "additionalProperties": False}}},
    "required": ["type", "label", "children", "attributes"], "additionalProperties": False}
NAMED = {"type": "object", "properties": {  # Home Assistant's HassTurnOn
    "name": {"type": "string", "maxLength": 32}, "area": {"type": "string", "maxLength": 32},
    "domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch", "fan"]}, "maxItems": 2}}}
# (schema, a value it allows, a value it refuses): accepted, and the grammar agrees on both
ENFORCED: list[tuple[Any, str, str]] = [
    (PET, '{"pet": {"kind": "cat", "lives": 3}, "either": {"kind": "dog", "good": true}, "nick": null}',
     '{"pet": {"kind": "cat", "good": true}, "either": {"kind": "dog", "good": true}}'),
    (UI, '{"type": "div", "label": "x", "children": [], "attributes": []}',
     '{"type": "table", "label": "x", "children": [], "attributes": []}'),
    ({"type": "object", "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/step"}},
                                       "final_answer": {"type": "string"}}, "$defs": {"step": STEP},
      "required": ["steps", "final_answer"], "additionalProperties": False},
     '{"steps": [{"explanation": "e", "output": "o"}], "final_answer": "x"}', '{"steps": [{}], "final_answer": "x"}'),
    (NAMED, '{"name": "kitchen", "domain": ["light"]}', '{"domain": ["door"]}'),
    ({"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                       "y": {"type": ["string", "null"]}}, "required": ["x", "y"]},
     '{"x": null, "y": "s"}', '{"x": 1, "y": null}'),
    ({"type": "object", "anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                  {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
     '{"a": 1}', "{}"),
    ({"oneOf": [{"const": "a"}, {"const": "b"}]}, '"a"', '"c"'),
    ({"type": ["number", "null"], "minimum": 0, "default": None}, "1.5", "-1"),
    ({"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5}, "10", "7"),
    ({"type": "string", "format": "password", "maxLength": 3}, '"abc"', '"abcd"'),  # a format xgrammar ignores
    ({"type": "string", "pattern": "^[a-z]{1,3}$"}, '"abc"', '"abcd"'),
    ({"type": "integer", "enum": [1, 2], "minimum": 1}, "2", "3"),
    ({"properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a": 1}', "{}"),  # an object by its properties
    ({"type": "object", "properties": {"path": {"type": "string"}, "recursive": {"type": "boolean", "default": False}},
      "required": ["path"], "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"},
     '{"path": "/"}', '{"recursive": true}'),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "1", "1.5"),
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5},
                                       "e": {"type": "string", "enum": ["a"]}, "c": {"type": "string", "const": "k"},
                                       "f": {"type": "number", "enum": [1, 2.5]}}},
     '{"n": 5, "e": "a", "c": "k", "f": 2.5}', '{"n": 3}'),
    ({"type": "object", "properties": {"p": {"allOf": [{"$ref": "#/$defs/S"}], "description": "d"},
                                       "r": {"$ref": "#/$defs/S", "description": "r"}},
      "$defs": {"S": {"type": "object", "properties": {"q": {"type": "string"}}}}},
     '{"p": {"q": "x"}, "r": {}}', '{"p": {"q": 1}}'),
]


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    """A compiler over a tiny vocabulary (printable ASCII): enough to ask the grammar what it accepts."""
    info = xgr.TokenizerInfo([chr(c) for c in range(32, 127)] + ["</s>"], stop_token_ids=[95])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def grammar_accepts(compiler: xgr.GrammarCompiler, schema: Any, text: str) -> bool:
    """Whether the grammar the server compiles (as GrammarCache._compile) lets ``text`` through whole."""
    grammar = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    matcher = xgr.GrammarMatcher(grammar)
    return matcher.accept_string(json.dumps(json.loads(text))) and matcher.is_completed()


def valid(schema: Any, text: str) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))


def json_schema(schema: Any) -> ResponseFormat:
    return msgspec.convert({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, ResponseFormat)


@pytest.mark.parametrize(("schema", "where", "broken"), MIS_ENFORCED)
def test_a_schema_the_grammar_follows_in_part_is_refused(compiler: xgr.GrammarCompiler, schema: dict[str, Any],
                                                         where: str, broken: str) -> None:
    """Before: each was served, and the answer could break the schema the API promised."""
    assert grammar_accepts(compiler, schema, broken) and not valid(schema, broken)
    with pytest.raises(BadRequest) as refused:
        response_format_constraint(json_schema(schema))
    assert refused.value.param == "response_format.json_schema.schema"
    assert f"(at {where})" in refused.value.message, refused.value.message


def test_draft_7_dependencies_are_refused_too(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "object", "properties": AB, "dependencies": {"a": ["b"]}}
    assert grammar_accepts(compiler, schema, '{"a": 1}')
    assert not jsonschema.Draft7Validator(schema).is_valid({"a": 1})
    with pytest.raises(BadRequest, match=r"\(at dependencies\)"):
        response_format_constraint(json_schema(schema))


@pytest.mark.parametrize(("schema", "good", "bad"), ENFORCED)
def test_the_schemas_clients_send_pass_and_are_enforced(compiler: xgr.GrammarCompiler, schema: Any, good: str,
                                                        bad: str) -> None:
    assert response_format_constraint(json_schema(schema))
    assert valid(schema, good) and grammar_accepts(compiler, schema, good)
    assert not valid(schema, bad) and not grammar_accepts(compiler, schema, bad)


def binary_tree(depth: int) -> dict[str, Any]:
    """Objects of two required properties, ``depth`` levels through $defs: 2**depth null leaves."""
    defs: dict[str, Any] = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"},
                                                                         "y": {"$ref": f"#/$defs/d{i + 1}"}},
                                      "required": ["x", "y"], "additionalProperties": False} for i in range(depth)}
    defs[f"d{depth}"] = {"type": "null"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


HUGE = [  # a few bytes of schema, gigabytes of forced text (xgrammar's std::bad_alloc, or the server killed)
    ({"type": "array", "items": {"type": "null"}, "minItems": 1_000_000_000}, "minItems"),
    ({"type": "string", "pattern": "a{1000000000}"}, "pattern"),
    ({"type": "string", "pattern": "((a{1000}){1000}){1000}"}, "pattern"),
    ({"type": "string", "minLength": 5000}, "minLength"),
    ({"type": "object", "minProperties": 5000}, "minProperties"),
    ({"type": "array", "minContains": 5000}, "minContains"),
    ({"type": "object", "patternProperties": {"^x{100000}$": {"type": "integer"}}}, "patternProperties"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "(ab{40}){40}"}}}},
     "properties.a.items.pattern"),
]


@pytest.mark.parametrize(("schema", "where"), HUGE)
def test_a_short_schema_that_forces_huge_text_is_refused(schema: dict[str, Any], where: str) -> None:
    with pytest.raises(BadRequest) as refused:
        response_format_constraint(json_schema(schema))
    assert refused.value.param == "response_format.json_schema.schema" and f"(at {where})" in refused.value.message


def test_forced_text_multiplied_through_nesting_is_refused() -> None:
    """No keyword is large, but the product is: a tree of 2**20 leaves ran xgrammar out of memory."""
    exact = {"type": "array", "minItems": 256, "maxItems": 256, "items": {
        "type": "array", "items": {"type": "null"}, "minItems": 256, "maxItems": 256}}
    for schema in (binary_tree(20), exact):
        with pytest.raises(BadRequest, match="more than 16384 characters") as refused:
            response_format_constraint(json_schema(schema))
        assert refused.value.param == "response_format.json_schema.schema"
    for schema in (binary_tree(8), {"type": "array", "items": {"type": "null"}, "minItems": MAX_REPEAT},
                   {"type": "string", "pattern": f"^[a-z]{{{MAX_REPEAT}}}$"}):
        assert response_format_constraint(json_schema(schema))


def test_regex_weight_multiplies_nested_lower_bounds() -> None:
    assert regex_weight("a{1000}") == 1000
    assert regex_weight("((a{10}){10}){10}") == 1000
    assert regex_weight("(ab|c)+x*") == 3
    assert regex_weight(r"^\d{3}-\p{L}{4}[]a-z]{2,9}$") == 3 + 1 + 4 + 2
    assert regex_weight("a{1000000000}") > MAX_REPEAT


def tools(parameters: Any, responses: bool = False) -> list[Any]:
    if responses:
        return msgspec.convert([{"type": "function", "name": "f", "parameters": parameters}],
                               list[ResponsesFunctionTool])
    return msgspec.convert([{"type": "function", "function": {"name": "f", "parameters": parameters}}],
                           list[FunctionTool])


def test_tool_parameters_must_describe_an_object() -> None:
    """Before: a scalar schema let the grammar write "arguments": "hello", which the call parser never
    finished: the call was dropped, silently (with tool_choice required: no content and no call)."""
    for parameters in ({"type": "string"}, {"type": ["object", "null"]}, {"description": "no args"},
                       {"anyOf": [{"type": "object"}, {"type": "integer"}]}):
        with pytest.raises(BadRequest) as refused:
            parse_tools(tools(parameters))
        assert refused.value.param == "tools[0].function.parameters" and "object" in refused.value.message
    with pytest.raises(BadRequest) as refused:
        parse_tools(tools({"type": "null"}, responses=True))
    assert refused.value.param == "tools[0].parameters"
    for parameters in (None, {}, {"type": "object"}, {"type": ["object"]}, NAMED, {"properties": {"a": {}}},
                       {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"$ref": "#/$defs/o"}],
                        "$defs": {"o": {"type": "object"}}}):
        assert parse_tools(tools(parameters))[0].name == "f"


@pytest.mark.parametrize("answer", ["Use a <", "x < y means y is bigger: 1 <"])
def test_a_lone_less_than_ending_an_answer_is_text(answer: str) -> None:
    """Before: held back as the start of <tool_call>, and dropped at the end."""
    assert parse_all(answer) == (answer, [])
    parser = ToolCallParser()
    events = [e for char in answer for e in parser.feed(char)] + parser.finish()
    assert "".join(e.text for e in events) == answer and not parser.dropped
    parser = ToolCallParser()
    assert "".join(e.text for e in parser.feed("a <tool") + parser.finish()) == "a " and parser.dropped
