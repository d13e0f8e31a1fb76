"""Reading policy files: YAML -> validated Policy, with errors a person can act on.

Every error names the file, the key path (``classes.voice.default_queue_policy.max_queue_size``),
the line where that key sits, and the problem. Duplicate YAML keys are errors too: PyYAML would
silently keep the last one, which is exactly the kind of mistake a policy file must not hide.

With ``known_models`` (the model repository's names; the server passes them), a class naming a model
the repository lacks is reported at ``classes.<name>.model``; the alias pinned to that class's old
model would otherwise be the only thing reported, at the wrong key. A ``ModelCatalog`` in its place
(the server's, ``homeai policy validate``'s) also refuses, at the same key, a model that is not pulled
and models that do not fit the memory budget (``homeai.policy.catalog``).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from homeai.policy.catalog import ModelCatalog, catalog_problems
from homeai.policy.schema import SCHEMA_MODELS, Policy

_KNOWN_KEYS = sorted(
    {f.alias or name for model in SCHEMA_MODELS for name, f in model.model_fields.items()}
)


class PolicyError(Exception):
    """An invalid policy. ``errors`` is a list of (key_path, message); key_path is "" for the file.
    ``lines`` maps a key path to the 1-based line it sits on ("" -> the line of a YAML syntax error)."""

    def __init__(self, source: str, errors: list[tuple[str, str]], lines: dict[str, int] | None = None):
        self.source = source
        self.errors = errors
        self.lines = lines or {}
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.errors)
        out = [f"{self.source}: invalid policy ({n} error{'s' if n != 1 else ''})"]
        for path, msg, line in self.located():
            where = f"{self.source}:{line}: " if line and path else ""  # a syntax error names its line itself
            out.append(f"  {where}{path + ': ' if path else ''}{msg}")
        return "\n".join(out)

    def located(self) -> list[tuple[str, str, int | None]]:
        """(key path, message, 1-based line or None) of every error, in order."""
        return [(path, msg, self.lines.get(path)) for path, msg in self.errors]


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys in a mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r}", key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats: PyYAML (YAML 1.1) reads "5e-2" (no dot) as a string, which the strict schema then
# refused as "not a number". The resolver PyYAML keeps for floats, with the dot made optional.
_StrictLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _first in "-+0123456789.":
    _StrictLoader.yaml_implicit_resolvers[_first] = [
        (tag, regexp) for tag, regexp in _StrictLoader.yaml_implicit_resolvers.get(_first, [])
        if tag != "tag:yaml.org,2002:float"]
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"""^(?:
     [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X), list("-+0123456789."))


def load_policy(path: str | Path, known_models: Collection[str] | None = None) -> Policy:
    """Read and validate a policy file; raises PolicyError (also for a missing or unreadable file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(str(path), [("", f"cannot read file: {e.strerror or e}")]) from e
    except UnicodeDecodeError as e:
        raise PolicyError(str(path), [("", f"not UTF-8 text: byte {e.object[e.start]:#04x} at offset {e.start}")]
                          ) from e
    return parse_policy(text, source=str(path), known_models=known_models)


def unknown_class_models(data: dict[Any, Any], known_models: Collection[str]) -> dict[str, tuple[str, str]]:
    """class name -> (key path, message) for every class whose ``model`` is not in ``known_models``."""
    classes = data.get("classes")
    found: dict[str, tuple[str, str]] = {}
    if not isinstance(classes, dict):
        return found
    known = ", ".join(sorted(known_models)) or "none"
    for name, cls in classes.items():
        model = cls.get("model") if isinstance(cls, dict) else None
        if isinstance(model, str) and model not in known_models:
            found[str(name)] = (f"classes.{name}.model",
                                f"unknown model {model!r}: not in the model repository (known: {known})")
    return found


def _is_consequence(err: Any, data: dict[Any, Any], bad_classes: Collection[str]) -> bool:
    """An alias's model mismatch caused by its class naming an unknown model (reported there instead)."""
    loc = tuple(err["loc"])
    if len(loc) != 3 or loc[0] != "aliases" or loc[2] != "model":
        return False
    alias = _child(data.get("aliases"), loc[1])
    return isinstance(alias, dict) and alias.get("class") in bad_classes


def parse_policy(text: str, source: str = "<string>", known_models: Collection[str] | None = None) -> Policy:
    """Validate policy YAML text; raises PolicyError naming ``source``, key paths and lines."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        lines = {"": mark.line + 1} if mark is not None else None
        raise PolicyError(source, [("", f"YAML syntax error: {where}{e.problem or e}")], lines) from e
    except yaml.YAMLError as e:
        raise PolicyError(source, [("", f"YAML error: {e}")]) from e
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise PolicyError(source, [("", f"a policy is a mapping of keys (classes, users, ...), got {got}")])
    unknown = unknown_class_models(data, known_models) if known_models is not None else {}
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        kept = [err for err in e.errors() if not _is_consequence(err, data, unknown)]
        errors = [*unknown.values(), *(_describe(err, data) for err in kept)]
        locs = [("classes", name, "model") for name in unknown] + [err["loc"] for err in kept]
        raise PolicyError(source, errors, _key_lines(text, locs, [p for p, _ in errors])) from e
    if unknown:
        locs = [("classes", name, "model") for name in unknown]
        errors = list(unknown.values())
        raise PolicyError(source, errors, _key_lines(text, locs, [p for p, _ in errors]))
    if isinstance(known_models, ModelCatalog) and (refused := catalog_problems(policy, known_models)):
        locs = [("classes", name, "model") for name in refused]
        errors = list(refused.values())
        raise PolicyError(source, errors, _key_lines(text, locs, [p for p, _ in errors]))
    return policy


def _describe(err: Any, data: Any) -> tuple[str, str]:
    loc = tuple(err["loc"])
    is_key = bool(loc) and loc[-1] == "[key]"
    path = key_path(loc[:-1] if is_key else loc, data)
    kind = err["type"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _KNOWN_KEYS, n=1, cutoff=0.75)
        return path, "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
    if kind == "missing":
        return path, "required key is missing"
    msg = err["msg"]
    if is_key:
        msg = f"invalid key: {msg}"
    if kind != "policy" and isinstance(err.get("input"), str | int | float | bool | type(None)):
        msg += f" (got {err['input']!r})"
    return path, msg


def key_path(loc: tuple[Any, ...], data: Any = None) -> str:
    """``("classes", "voice", "preferred_batch_size", 1)`` -> ``classes.voice.preferred_batch_size[1]``.

    With ``data``, an int is written ``[i]`` only where the value at that point is a list, so mapping
    keys that are numbers (priority levels) read as ``priority_queue_policy.2``.
    """
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int) and (node is None or isinstance(node, list)):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
        node = _child(node, part)
    return out


def _child(node: Any, part: Any) -> Any:
    if isinstance(node, dict):
        return node.get(part, node.get(str(part)))
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return None


def _key_lines(text: str, locs: list[Any], paths: list[str]) -> dict[str, int]:
    """1-based line of the deepest existing YAML node on each error's path."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}
    for loc, path in zip(locs, paths, strict=True):
        node, line = root, None
        for part in loc:
            nxt = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == str(part):
                        nxt, line = v, k.start_mark.line + 1
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                nxt = node.value[part]
                line = nxt.start_mark.line + 1
            if nxt is None:
                break
            node = nxt
        if line is not None:
            lines[path] = line
    return lines


def policy_json_schema() -> dict[str, Any]:
    """JSON Schema of a policy file, for editors (yaml-language-server) and `homeai policy schema`."""
    schema = Policy.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "HomeAI policy"}


def diff_policies(a: Policy, b: Policy) -> list[str]:
    """Flattened differences, one line per key path, ``classes.voice.max_batch_size: 8 -> 16``.

    A whole class, user or alias that appears or disappears is one ``added`` / ``removed`` line.
    """
    out: list[str] = []
    _diff(a.model_dump(mode="json", by_alias=True), b.model_dump(mode="json", by_alias=True), "", out)
    return out


def _diff(old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in new:
                out.append(f"{sub}: removed")
            elif key not in old:
                out.append(f"{sub}: added")
            else:
                _diff(old[key], new[key], sub, out)
    elif old != new:
        out.append(f"{path}: {json.dumps(old)} -> {json.dumps(new)}")
