"""Which JSON Schemas the grammar (xgrammar 0.2.9, strict) enforces in full; ``check_schema`` refuses the
others with a 400 naming the field and the keyword's path. ``{"not": {}}``, which nothing satisfies, was
served as "any JSON" and answered ``null``; ``{"type": "object", "required": ["a"], "anyOf": [...]}`` was
served as its ``anyOf`` alone and answered objects without ``a``; ``uniqueItems``, ``contains``, an ``allOf``
of several, a ``oneOf`` whose branches overlap, a keyword of one type where no type is given, a length
beside a pattern, ... were dropped. So is a schema whose forced text is huge (``{"minItems": 1000000000,
"items": {"type": "null"}}``): xgrammar builds that text whole, gigabytes of it. Each refusal was checked
against xgrammar 0.2.9 (tests/unit/api/test_structured_review_fixes.py shows the value it let through); a
new xgrammar may enforce more.
"""

from __future__ import annotations

import json
import re
from typing import Any

from homeai.api.errors import BadRequest

# xgrammar ignores these: the output would not follow them
UNENFORCED = ("not", "if", "then", "else", "contains", "dependentRequired", "dependentSchemas", "dependencies")
# xgrammar follows the first of these a schema has and drops every other keyword beside it
EXCLUSIVE = ("$ref", "allOf", "anyOf", "oneOf", "enum", "const")
CONSTRAINING = frozenset({  # the keywords that say what a value may be (not title, description, $defs, ...)
    "type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern",
    "items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains", "minItems", "maxItems",
    "uniqueItems", "unevaluatedItems", "properties", "patternProperties", "additionalProperties", "required",
    "propertyNames", "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties"})
MAX_REPEAT = 1024  # a repetition xgrammar may have to write out: 4096 nulls took 1.2 s and 700 MB to force
MAX_SHORTEST = 16384  # characters an answer may need before it can end (each choice at its longest)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties", "contains", "propertyNames", "additionalItems",
                "unevaluatedItems", "unevaluatedProperties")
# the keywords of one JSON type: xgrammar drops them where a schema does not say (or imply) that type
_TYPED = {"number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
          "string": ("minLength", "maxLength", "pattern"), "array": ("minItems", "maxItems"),
          "object": ("minProperties", "maxProperties", "propertyNames", "patternProperties", "required")}
_FORMATS = frozenset({  # the string formats xgrammar writes itself (it ignores others)
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri", "uri-reference",
    "uri-template", "json-pointer", "relative-json-pointer"})
_SCALAR = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern")
_DROPPED = "cannot be enforced while the answer is generated; write the schema without it"
_QUANTIFIER = re.compile(r"\{(\d+)(?:,\d*)?\}")


def unenforced_keyword(schema: Any, at: str = "") -> str | None:
    """Where in ``schema`` the first keyword the grammar cannot enforce is (``properties.a.not``), or None.
    Only schema positions are walked: an ``enum`` or ``const`` value may hold any key."""
    found = _first_problem(_SchemaReader(schema), schema, at)
    return None if found is None else found[0]


def _first_problem(reader: _SchemaReader, schema: Any, at: str) -> tuple[str, str] | None:
    """The path of the first keyword the grammar would not enforce (subschemas depth first), and why."""
    if not isinstance(schema, dict):
        return None
    found = _node_problem(reader, schema)
    if found is not None:
        return f"{at}{found[0]}", found[1]
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
        deeper = _first_problem(reader, sub, f"{at}{path}.")
        if deeper is not None:
            return deeper
    return None


def _node_problem(reader: _SchemaReader, node: dict[str, Any]) -> tuple[str, str] | None:
    """The first keyword of ``node`` itself (not of its subschemas) the grammar would not enforce, and why."""
    for key in UNENFORCED:
        if key in node:
            return key, _DROPPED
    if node.get("uniqueItems") is True:
        return "uniqueItems", _DROPPED
    if "multipleOf" in node and not _integer_multiple(node):
        return "multipleOf", ("is enforced only as an integer on \"type\": \"integer\", unbounded or between bounds "
                              "less than 10000 apart; write the schema without it")
    for key in ("minItems", "minContains", "minLength", "minProperties"):
        if _count(node.get(key)) > MAX_REPEAT:
            return key, f"above {MAX_REPEAT} cannot be served: the grammar writes such a repetition out whole"
    patterns = [("pattern", node.get("pattern")), *(("patternProperties", p) for p in _dict(node, "patternProperties"))]
    for key, pattern in patterns:
        if isinstance(pattern, str) and regex_weight(pattern) > MAX_REPEAT:
            return key, f"forces more than {MAX_REPEAT} characters, which the grammar writes out whole"
    return (_combination_problem(reader, node) or _object_problem(node) or _string_problem(node)
            or _typeless_problem(reader, node))


def _string_problem(node: dict[str, Any]) -> tuple[str, str] | None:
    """String keywords xgrammar drops: a length beside a pattern (``^a+$`` with maxLength 2 allowed "aaa"),
    a pattern or a length beside a format it writes itself."""
    fmt, pattern = node.get("format"), node.get("pattern")
    if isinstance(fmt, str) and fmt in _FORMATS:
        beside = next((key for key in ("pattern", "minLength", "maxLength") if key in node), None)
        if beside is not None:
            return beside, f"beside format {fmt!r} {_DROPPED}"
    beside = next((key for key in ("minLength", "maxLength") if key in node), None) if pattern is not None else None
    return None if beside is None else (beside, f"beside pattern {_DROPPED} (or write the length into the pattern)")


def _object_problem(node: dict[str, Any]) -> tuple[str, str] | None:
    """Object keywords xgrammar drops: a required name that ``properties`` does not list (``{"required":
    ["b"]}`` allowed ``{}``), ``patternProperties`` beside both ``properties`` and ``additionalProperties``,
    or one that matches a listed property too."""
    props = _dict(node, "properties")
    missing = [name for name in _names(node.get("required")) if name not in props]
    if missing:
        return "required", f"names {missing[0]!r}, which properties does not list; the grammar never writes it"
    if props and "patternProperties" in node and node.get("additionalProperties", False) is not False:
        return "patternProperties", f"beside both properties and additionalProperties {_DROPPED}"
    both = next((name for name in props for regex in _dict(node, "patternProperties") if _matches(regex, name)), None)
    if both is not None:  # JSON Schema applies both schemas to it; xgrammar one
        return "patternProperties", f"matches property {both!r} too, which the grammar holds to one schema only"
    return None


def _matches(regex: str, name: str) -> bool:
    """Whether a JSON Schema ``regex`` finds a match in ``name`` (True where Python cannot tell)."""
    try:
        return re.search(regex, name) is not None
    except re.error:
        return True


def _typeless_problem(reader: _SchemaReader, node: dict[str, Any]) -> tuple[str, str] | None:
    """A keyword of one JSON type in a schema that does not give its type: xgrammar drops it (``{"minimum": 2}``
    allowed 0) unless it infers the type (an object from ``properties``, an array from ``items``)."""
    if "type" in node or any(key in node for key in EXCLUSIVE):
        return None
    inferred = reader.types(node) or set()
    for kind, keys in _TYPED.items():
        key = next((key for key in keys if key in node), None)
        if key is not None and kind not in inferred:
            return key, f"cannot be enforced without \"type\": \"{kind}\" beside it"
    return None


def _combination_problem(reader: _SchemaReader, node: dict[str, Any]) -> tuple[str, str] | None:
    """``allOf`` of several, ``oneOf`` that xgrammar reads as ``anyOf``, or one of ``EXCLUSIVE`` beside
    keywords that xgrammar drops for it (a ``type`` that all its alternatives keep anyway is fine)."""
    members = node.get("allOf")
    if isinstance(members, list) and len(members) > 1:
        return "allOf", "with more than one member is not enforced (the grammar keeps one); merge them into one schema"
    branches = node.get("oneOf")
    if isinstance(branches, list) and len(branches) > 1 and not reader.disjoint(branches):
        return "oneOf", ("is enforced as anyOf unless its branches differ in type, in enum/const values, or in the "
                         "enum/const of a property they all require; use anyOf where several may match")
    for head in (key for key in EXCLUSIVE if key in node):
        beside = sorted(key for key in CONSTRAINING & node.keys()
                        if key != head and not _harmless(reader, node, head, key))
        if beside:
            return head, f"cannot be enforced beside {beside[0]!r} (the grammar follows one); put them in one subschema"
    return None


def _harmless(reader: _SchemaReader, node: dict[str, Any], head: str, key: str) -> bool:
    """Whether ``key`` beside ``head`` says nothing the grammar's reading of ``head`` does not already: a
    ``type`` that every alternative (or enum value) of ``head`` has, a bound that every enum value meets.
    Beside ``enum``/``const``, structural keywords (``properties``, ``items``, a ``const`` beside an
    ``enum``) are not checked against the values."""
    if head in ("enum", "const") and key in _SCALAR:
        return all(_fits(value, key, node[key]) for value in _values(node) or ())
    if head in ("enum", "const") and key not in ("type", "$ref", "allOf", "anyOf", "oneOf"):
        return True
    if key != "type":
        return False
    if head == "$ref":
        found = reader.types(reader.resolve(node["$ref"]))
    elif head in ("enum", "const"):
        found = _value_types(_values(node))
    else:
        found = reader.union(_list(node, head))
    declared = _declared_types(node["type"])
    return declared is not None and found is not None and _within(found, declared)


def _fits(value: Any, key: str, bound: Any) -> bool:
    """Whether ``value`` meets the scalar keyword ``key`` (one of another JSON type's holds trivially)."""
    if key in ("minLength", "maxLength", "pattern"):
        if not isinstance(value, str):
            return True
        if key == "pattern":
            try:
                return isinstance(bound, str) and re.search(bound, value) is not None
            except re.error:  # not Python's dialect: cannot tell
                return False
        return isinstance(bound, int) and (len(value) >= bound if key == "minLength" else len(value) <= bound)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return True
    if not isinstance(bound, int | float):
        return False
    return {"minimum": value >= bound, "maximum": value <= bound, "exclusiveMinimum": value > bound,
            "exclusiveMaximum": value < bound}[key]


class _SchemaReader:
    """What the grammar makes of the subschemas of one schema, each worked out once (a ``$defs`` graph may
    share a subschema many times over): the JSON types it allows, and how long an answer it may force."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._types: dict[int, set[str] | None] = {}
        self._sizes: dict[int, int] = {}

    def resolve(self, ref: Any) -> Any:
        return _resolve(self.root, ref) if isinstance(self.root, dict) and isinstance(ref, str) else None

    def types(self, node: Any) -> set[str] | None:
        """The JSON types the grammar lets ``node`` produce; None where it cannot tell (or any type)."""
        if not isinstance(node, dict) or id(node) in self._types:
            return self._types.get(id(node)) if isinstance(node, dict) else None
        self._types[id(node)] = None  # a cycle: unknown
        found = _declared_types(node["type"]) if "type" in node else _value_types(_values(node))
        branches = next((node[k] for k in ("anyOf", "oneOf", "allOf") if isinstance(node.get(k), list)), None)
        if found is None and "$ref" in node:
            found = self.types(self.resolve(node["$ref"]))
        elif found is None and branches is not None:
            found = self.union(branches)
        elif found is None and ("properties" in node or "additionalProperties" in node):
            found = {"object"}  # as xgrammar reads it (JSON Schema would allow any non-object too)
        elif found is None and ("items" in node or "prefixItems" in node):
            found = {"array"}
        self._types[id(node)] = found
        return found

    def union(self, branches: list[Any]) -> set[str] | None:
        found = [self.types(branch) for branch in branches]
        known = [types for types in found if types is not None]
        return set().union(*known) if len(known) == len(found) else None

    def disjoint(self, branches: list[Any]) -> bool:
        """Whether no value matches two of ``branches`` (then xgrammar's anyOf is the oneOf asked for)."""
        nodes = [self.deref(branch) for branch in branches]
        return all(self._apart(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:])

    def deref(self, node: Any) -> Any:
        """``node``, or the schema its ``$ref`` chain leads to."""
        for _ in range(64):
            if not isinstance(node, dict) or not isinstance(node.get("$ref"), str):
                return node
            node = self.resolve(node["$ref"])
        return node

    def _apart(self, a: Any, b: Any) -> bool:
        if not isinstance(a, dict) or not isinstance(b, dict):
            return False
        # the types they declare: one that only implies its type ({"properties": ...}) lets any other through
        types_a, types_b = (_declared_types(a["type"]) if "type" in a else _value_types(_values(a)),
                            _declared_types(b["type"]) if "type" in b else _value_types(_values(b)))
        if types_a is not None and types_b is not None and not _widen(types_a) & _widen(types_b):
            return True
        if _values(a) is not None and _values(b) is not None:
            return _distinct(_values(a), _values(b))
        common = set(_names(a.get("required"))) & set(_names(b.get("required")))
        props_a, props_b = a.get("properties"), b.get("properties")
        if not isinstance(props_a, dict) or not isinstance(props_b, dict):
            return False
        return any(_distinct(_values(self.deref(props_a.get(name))), _values(self.deref(props_b.get(name))))
                   for name in common)

    def size(self, node: Any) -> int:
        """Characters the grammar may force from inside ``node`` (at most ``MAX_SHORTEST + 1``): its shortest
        answer with each choice (a branch, an optional property, an enum value) at its longest. xgrammar
        builds forced text whole: a tree of required properties 2**20 leaves wide ran out of memory."""
        if not isinstance(node, dict):
            return 1
        if id(node) in self._sizes:
            return self._sizes[id(node)]
        self._sizes[id(node)] = 0  # a cycle (an optional one: endless_ref refuses the others)
        parts = [8, self.size(self.resolve(node.get("$ref"))) if "$ref" in node else 0,
                 self._string_size(node), self._array_size(node), self._object_size(node)]
        parts += [len(json.dumps(value)) for value in _values(node) or ()]
        for key in ("anyOf", "oneOf", "allOf"):
            parts += [self.size(branch) for branch in _list(node, key)]
        size = self._sizes[id(node)] = min(max(parts), MAX_SHORTEST + 1)
        return size

    def _string_size(self, node: dict[str, Any]) -> int:
        pattern = node.get("pattern")
        return 2 + max(_count(node.get("minLength")), regex_weight(pattern) if isinstance(pattern, str) else 0)

    def _array_size(self, node: dict[str, Any]) -> int:
        prefix, items = _list(node, "prefixItems"), node.get("items")
        repeats = max(_count(node.get("minItems")) - len(prefix), 1 if isinstance(items, dict) else 0)
        return 2 + sum(self.size(sub) + 2 for sub in prefix) + repeats * (self.size(items) + 2)

    def _object_size(self, node: dict[str, Any]) -> int:
        props, other = _dict(node, "properties"), node.get("additionalProperties")
        required = set(_names(node.get("required")))
        sizes = {name: len(name) + 4 + self.size(props.get(name, other)) for name in {*props, *required}}
        optional = [size for name, size in sizes.items() if name not in required]
        return 2 + sum(sizes[name] for name in required) + max(optional, default=0)


def regex_weight(pattern: str) -> int:
    """The characters ``pattern`` forces at least, each alternative at its longest (capped far above the
    limits): ``a{1000}`` 1000, ``((a{10}){10}){10}`` 1000, ``(ab|c)+`` 2. A rough scanner (a class or an
    escape is one character), enough to tell a short pattern that xgrammar would write out by the gigabyte."""
    cap = (MAX_REPEAT + 1) * (MAX_SHORTEST + 1)
    frames = [[0, 0, 0]]  # per open group: its longest alternative so far, this alternative, the last atom
    i = 0
    while i < len(pattern):
        frame, char, atom = frames[-1], pattern[i], 1
        quantifier = _QUANTIFIER.match(pattern, i) if char == "{" else None
        if quantifier is not None:  # the last atom {m}: m times (at least once: it may be entered)
            times = max(min(int(quantifier.group(1)), cap), 1)
            frame[1], frame[2] = min(frame[1] + frame[2] * (times - 1), cap), min(frame[2] * times, cap)
            i = quantifier.end()
            continue
        if char == "(":
            frames.append([0, 0, 0])
            i += 1
            continue
        if char == "|":
            frame[:] = [max(frame[0], frame[1]), 0, 0]
            i += 1
            continue
        if char == ")" and len(frames) > 1:
            atom = max(frames.pop()[:2])
            frame = frames[-1]
        elif char in "^$*+?":
            atom = 0 if char in "^$" else -1
        i = _escape_end(pattern, i) if char == "\\" else _class_end(pattern, i) if char == "[" else i + 1
        if atom >= 0:
            frame[1], frame[2] = min(frame[1] + atom, cap), atom
    while len(frames) > 1:  # unbalanced: close what is open
        atom = max(frames.pop()[:2])
        frames[-1][1] += atom
    return max(frames[0][:2])


def _escape_end(pattern: str, i: int) -> int:
    """The index after the escape at ``i`` (``\\d``, ``\\u00e9``, ``\\p{L}``)."""
    kind = pattern[i + 1:i + 2]
    if kind in ("p", "P", "k", "x", "u", "N") and pattern[i + 2:i + 3] == "{":
        end = pattern.find("}", i + 2)
        return len(pattern) if end < 0 else end + 1
    return i + {"u": 6, "x": 4}.get(kind, 2)


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class that starts at ``i`` (``[^]a\\]]``)."""
    j = i + 1
    j += pattern[j:j + 1] == "^"
    j += pattern[j:j + 1] == "]"
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def object_only(schema: Any) -> bool:
    """Whether the grammar lets ``schema`` produce JSON objects only (a call's arguments are one)."""
    return _SchemaReader(schema).types(schema) == {"object"}


def _values(node: Any) -> list[Any] | None:
    """The values an ``enum`` or ``const`` allows (None: neither)."""
    if not isinstance(node, dict):
        return None
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    return [node["const"]] if "const" in node else None


def _value_types(values: list[Any] | None) -> set[str] | None:
    return None if values is None else {_json_type(value) for value in values}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or isinstance(value, float) and value.is_integer():
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "null")


def _declared_types(declared: Any) -> set[str] | None:
    if isinstance(declared, str):
        return {declared}
    return set(declared) if isinstance(declared, list) and all(isinstance(t, str) for t in declared) else None


def _widen(types: set[str]) -> set[str]:
    """A number may be an integer: the two overlap."""
    return types | {"integer"} if "number" in types else types


def _within(found: set[str], declared: set[str]) -> bool:
    return found <= _widen(declared)


def _distinct(a: list[Any] | None, b: list[Any] | None) -> bool:
    """Whether two lists of enum/const values have no value in common (1 and 1.0 are the same in JSON)."""
    if a is None or b is None:
        return False
    return not {_canonical(value) for value in a} & {_canonical(value) for value in b}


def _canonical(value: Any) -> str:
    def plain(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [plain(item) for item in v]
        return {k: plain(item) for k, item in v.items()} if isinstance(v, dict) else v
    return json.dumps(plain(value), sort_keys=True)


def _list(node: dict[str, Any], key: str) -> list[Any]:
    value = node.get(key)
    return value if isinstance(value, list) else []


def _dict(node: dict[str, Any], key: str) -> dict[str, Any]:
    value = node.get(key)
    return value if isinstance(value, dict) else {}


def _names(required: Any) -> list[str]:
    return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []


def _count(value: Any) -> int:
    """A count keyword's value (0 when it is none)."""
    return int(min(value, MAX_SHORTEST + 1)) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value > 0 else 0


def _integer_multiple(node: dict[str, Any]) -> bool:
    """Whether xgrammar enforces the node's ``multipleOf``: an integer one on integers only, with no bounds
    or both less than 10 000 apart (minimum 0 alone, or a range of a million, allowed 1 as a multiple of 2)."""
    step, types = node.get("multipleOf"), _declared_types(node.get("type"))
    if not isinstance(step, int) or isinstance(step, bool) or types is None or "integer" not in types \
            or "number" in types:
        return False
    lower = next((node[key] for key in ("minimum", "exclusiveMinimum") if key in node), None)
    upper = next((node[key] for key in ("maximum", "exclusiveMaximum") if key in node), None)
    if lower is None and upper is None:
        return True
    return isinstance(lower, int | float) and isinstance(upper, int | float) and upper - lower < 9999


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
    """A 400 naming ``field`` for a schema the grammar cannot honour: a keyword it would drop, a schema that
    requires itself without end, or one whose forced text would be huge."""
    reader = _SchemaReader(schema)
    try:
        found = _first_problem(reader, schema, "")
        ref = endless_ref(schema) if found is None else None
        size = reader.size(schema) if found is None and ref is None else 0
    except RecursionError:  # a chain of $refs a thousand deep: no schema a tool or an answer needs
        raise BadRequest("the JSON Schema's $refs lead more than a thousand levels deep", param=field) from None
    if found is not None:
        where, why = found
        keyword = where.rpartition(".")[2].partition("[")[0]
        raise BadRequest(f"JSON Schema keyword {keyword!r} (at {where}) {why}", param=field)
    if ref is not None:
        raise BadRequest(f"the JSON Schema requires itself without end (through {ref}): no finite JSON "
                         "matches it", param=field)
    if size > MAX_SHORTEST:
        raise BadRequest(f"an answer to this JSON Schema may need more than {MAX_SHORTEST} characters before it "
                         "can end (its required parts, each choice at its longest)", param=field)
