"""Structured output as the clients ask for it: OpenAI ``response_format`` and Ollama ``format``, turned
into the engine's grammar constraint and the field it came from (which a 400 names if the grammar cannot
be compiled). Anything we cannot honour is a 400 naming the field, and so is a schema keyword the grammar
would silently drop (``not``, ``if``/``then``/``else``): ``{"not": {}}``, which nothing satisfies, was
served as "any JSON", and answered ``null``."""

from __future__ import annotations

import json
from typing import Any

from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import ResponseFormat, TextFormat
from homeai.core.types import Constraint, ConstraintKind

JSON_OBJECT = Constraint(ConstraintKind.JSON_OBJECT)
Sourced = tuple[Constraint, str]  # a constraint and the request field it came from


UNENFORCED = ("not", "if", "then", "else")  # xgrammar ignores these: the output would not follow them
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "contains", "propertyNames", "additionalItems",
                "unevaluatedItems", "unevaluatedProperties")


def unenforced_keyword(schema: Any, at: str = "") -> str | None:
    """Where in ``schema`` the first keyword the grammar cannot enforce is (``properties.a.not``), or None.
    Only schema positions are walked: an ``enum`` or ``const`` value may hold any key."""
    if not isinstance(schema, dict):
        return None
    for key in UNENFORCED:
        if key in schema:
            return f"{at}{key}"
    children: list[tuple[str, Any]] = []
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            children += [(f"{key}.{name}", sub) for name, sub in schema[key].items()]
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            children += [(f"{key}[{i}]", sub) for i, sub in enumerate(schema[key])]
    for key in _SCHEMA_ONES:
        value = schema.get(key)
        children += [(f"{key}[{i}]", sub) for i, sub in enumerate(value)] if isinstance(value, list) else [(key, value)]
    for path, sub in children:
        found = unenforced_keyword(sub, f"{at}{path}.")
        if found is not None:
            return found
    return None


def endless_ref(schema: Any) -> str | None:
    """The ``$ref`` of a schema that requires itself (a required property, a non-empty array's items, an
    ``allOf`` member, ... that leads back to where it started), or None. No finite JSON matches such a
    schema, and the grammar's forced text from it has no end: xgrammar built it until the server ran out
    of memory (``{"properties": {"a": {"$ref": "#"}}, "required": ["a"]}``, 21 GB in a minute)."""
    if not isinstance(schema, dict):
        return None
    state: dict[int, bool] = {}  # id of a subschema -> on the current path (True) or done (False)

    def walk(node: Any) -> str | None:
        if not isinstance(node, dict):
            return None
        key = id(node)
        if state.get(key) is False:
            return None
        state[key] = True
        for ref, child in _required_children(schema, node):
            if isinstance(child, dict) and state.get(id(child)) is True:
                return ref or "(a subschema that contains itself)"
            found = walk(child)
            if found is not None:
                return found
        state[key] = False
        return None

    return walk(schema)


def _required_children(root: dict[str, Any], node: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The subschemas every instance of ``node`` must also match (with the ``$ref`` that led there)."""
    out: list[tuple[str | None, Any]] = []
    ref = node.get("$ref")
    if isinstance(ref, str):
        out.append((ref, _resolve(root, ref)))
    properties, required = node.get("properties"), node.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        out += [(None, properties[name]) for name in required if isinstance(name, str) and name in properties]
    min_items = node.get("minItems", 0)
    min_items = min_items if isinstance(min_items, int) else 0
    if min_items >= 1 and isinstance(node.get("items"), dict):
        out.append((None, node["items"]))
    if isinstance(node.get("prefixItems"), list):
        out += [(None, sub) for sub in node["prefixItems"][:min_items]]
    if isinstance(node.get("allOf"), list):
        out += [(None, sub) for sub in node["allOf"]]
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and len(node[key]) == 1:
            out.append((None, node[key][0]))
    return out


def _resolve(root: dict[str, Any], ref: str) -> Any:
    """A local JSON pointer (``#``, ``#/$defs/node``) in ``root``; None for any other reference."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def check_schema(schema: Any, field: str) -> None:
    """A 400 naming ``field`` for a schema the grammar cannot honour: a keyword it would drop, or a schema
    that requires itself without end."""
    where = unenforced_keyword(schema)
    if where is not None:
        keyword = where.rpartition(".")[2]
        raise BadRequest(f"JSON Schema keyword {keyword!r} (at {where}) cannot be enforced while the answer is "
                         "generated; write the schema without it", param=field)
    try:
        ref = endless_ref(schema)
    except RecursionError:  # a chain of $refs a thousand deep: no schema a tool or an answer needs
        raise BadRequest("the JSON Schema's $refs lead more than a thousand levels deep", param=field) from None
    if ref is not None:
        raise BadRequest(f"the JSON Schema requires itself without end (through {ref}): no finite JSON "
                         "matches it", param=field)


def schema_constraint(schema: Any, field: str) -> Sourced:
    if not isinstance(schema, dict | bool):
        raise BadRequest("a JSON Schema must be an object", param=field)
    check_schema(schema, field)
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema, sort_keys=True)), field


def response_format_constraint(fmt: ResponseFormat | None, field: str = "response_format") -> Sourced | None:
    """OpenAI chat ``response_format``: text (no constraint), json_object, or json_schema (always strict)."""
    if fmt is None:
        return None
    schema = fmt.json_schema.schema if fmt.json_schema is not None else None
    return _typed_format(fmt.type, schema, field, f"{field}.json_schema.schema")


def text_format_constraint(fmt: TextFormat | None, field: str = "text.format") -> Sourced | None:
    """Responses API ``text.format``: like ``response_format`` with the schema beside the type."""
    return None if fmt is None else _typed_format(fmt.type, fmt.schema, field, f"{field}.schema")


def _typed_format(kind: str, schema: Any, field: str, schema_field: str) -> Sourced | None:
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT, field
    if schema is None:
        raise BadRequest("json_schema needs a 'schema'", param=schema_field)
    return schema_constraint(schema, schema_field)


def ollama_format_constraint(fmt: Any, field: str = "format") -> Sourced | None:
    """Ollama ``format``: "json" (a JSON object) or a JSON Schema; empty means plain text."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return JSON_OBJECT, field
    if isinstance(fmt, dict):
        return schema_constraint(fmt, field)
    raise BadRequest(f"format must be \"json\" or a JSON Schema, got {fmt!r}", param=field)
