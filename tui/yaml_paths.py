"""Where a key path (``classes.voice.targets.ttft_ms``) sits in YAML text, so an error lands on its line.

The server answers a 422 with key paths only; the editor needs lines. A block-style scan by indentation
is enough for policy files (stdlib only: the TUI carries no YAML parser). A key written inside a flow
mapping (``targets: {ttft_ms: 300}``) or one that is missing resolves to its deepest parent found.
"""

from __future__ import annotations

import re

_KEY_LINE = re.compile(r"^(?P<indent>\s*)(?P<dash>-\s+)?(?P<key>[^\s#:\-\[{][^:#]*?|\"[^\"]*\"|'[^']*')\s*:(\s|$)")
_INDEX = re.compile(r"\[\d+\]")
_LINE_IN_MESSAGE = re.compile(r"\bline (\d+)")


def split_path(path: str) -> list[str]:
    """``a.b[2].c`` -> ``["a", "b", "c"]`` (list indexes are not keys; they do not narrow the search)."""
    return [part for part in _INDEX.sub("", path).split(".") if part]


def key_lines(text: str) -> dict[str, int]:
    """Every block-style key's dotted path -> its 1-based line (the first occurrence wins)."""
    found: dict[str, int] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    for number, line in enumerate(text.splitlines(), start=1):
        match = _KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"]) + (len(match["dash"]) if match["dash"] else 0)
        key = match["key"].strip().strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        found.setdefault(".".join(k for _, k in stack), number)
    return found


def line_of(text: str, path: str, message: str = "") -> int | None:
    """The line an error belongs on: a ``line N`` named in the message (YAML syntax errors), else the
    key path's line, else its deepest parent's; None for a whole-file error with no line."""
    named = _LINE_IN_MESSAGE.search(message)
    if named:
        return int(named.group(1))
    parts = split_path(path)
    if not parts:
        return None
    lines = key_lines(text)
    for n in range(len(parts), 0, -1):
        line = lines.get(".".join(parts[:n]))
        if line is not None:
            return line
    return None
