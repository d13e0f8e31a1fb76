"""Structured output as the clients ask for it: OpenAI ``response_format`` and Ollama ``format``, turned
into the engine's grammar constraint and the field it came from (which a 400 names if the grammar cannot
be compiled). Anything we cannot honour is a 400 naming the field and the keyword's path
(``homeai.api.schema_rules``: what the grammar would follow only in part).
"""

from __future__ import annotations

import json
from typing import Any

from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import ResponseFormat, TextFormat
from homeai.api.schema_rules import check_schema
from homeai.core.types import Constraint, ConstraintKind

JSON_OBJECT = Constraint(ConstraintKind.JSON_OBJECT)
Sourced = tuple[Constraint, str]  # a constraint and the request field it came from


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
