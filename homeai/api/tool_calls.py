"""Reads the model's calls out of its text as it streams: text, then each call whole (its name, its
arguments, its end), in the order OpenAI streams them.

The grammar fixes the layout (``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``), so the
name is known once its header is complete, and the arguments are the JSON value after it, read by a
small scanner (a string may hold "}" or "</tool_call>"). A call is held back until its closing tag: one
that the budget (or a stop string) cuts short is dropped, so every call a client sees has complete
arguments, and no piece of the call syntax (``<tool_call``, a header, partial JSON) reaches the text.
A streamed answer and the same answer read at once give the same events joined, because both go
through this one parser.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from homeai.api.tools import CALL_CLOSE, CALL_OPEN

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*(?=\S)')  # complete once followed


@dataclass(slots=True)
class ToolCall:
    index: int
    name: str
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])
    arguments: str = ""  # JSON text, as OpenAI sends it

    def arguments_object(self) -> Any:
        """The arguments parsed (Ollama sends an object); text that is no JSON stays text."""
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return self.arguments


@dataclass(slots=True)
class ParseEvent:
    """One step of the answer: ``text``, a call started (``call`` with empty ``fragment``),
    an argument ``fragment`` of ``call``, or a call completed (``done``). A call's three come together,
    once its closing tag is read."""

    text: str = ""
    call: ToolCall | None = None
    fragment: str = ""
    done: bool = False


class ToolCallParser:
    """Feed text deltas, get events; ``finish`` ends the answer. ``calls``: the complete calls;
    ``dropped``: whether ``finish`` dropped unfinished call syntax (a call cut short, a partial tag)."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.dropped = False
        self._buf = ""
        self._in_call = False
        self._after_call = False  # whitespace right after a call is layout, not content
        self._name: str | None = None  # the current call's, once its header is read
        self._scanned = 0  # characters of the arguments (in _buf) scanned so far
        self._depth, self._in_string, self._escaped, self._args_done = 0, False, False, False  # JSON scan

    def feed(self, text: str) -> list[ParseEvent]:
        self._buf += text
        events: list[ParseEvent] = []
        while self._read_text(events) if not self._in_call else self._read_call(events):
            pass
        return events

    def finish(self) -> list[ParseEvent]:
        """The end of the answer: what is held back is dropped as call syntax (a call cut short, the start
        of ``<tool_call>`` such as ``<tool``, the layout after a call), except a lone ``<`` outside a call:
        that is text ("Use a <", "1 <"), which was lost."""
        text = self._buf if not self._in_call and self._buf == CALL_OPEN[0] else ""
        self.dropped = self._in_call or bool(self._buf.strip()) and not text
        self._buf, self._in_call, self._name, self._scanned, self._after_call = "", False, None, 0, False
        self._depth, self._in_string, self._escaped, self._args_done = 0, False, False, False
        return [ParseEvent(text=text)] if text else []

    # ---- states (each returns True when it moved on and another state may read) ------------------
    def _read_text(self, events: list[ParseEvent]) -> bool:
        if self._after_call:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._after_call = False
        start = self._buf.find(CALL_OPEN)
        if start >= 0:
            if start:
                events.append(ParseEvent(text=self._buf[:start]))
            self._buf = self._buf[start + len(CALL_OPEN):]
            self._in_call = True
            return True
        keep = _partial_suffix(self._buf, CALL_OPEN)  # "<tool" may become "<tool_call>"
        if len(self._buf) > keep:
            events.append(ParseEvent(text=self._buf[: len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep:]
        return False

    def _read_call(self, events: list[ParseEvent]) -> bool:
        """The header, then the arguments scanned as JSON (strings may hold "}" or even "</tool_call>"),
        then ``}</tool_call>``: only then is the call out, whole."""
        if self._name is None:
            match = _HEAD.match(self._buf)
            if match is None:
                return False
            self._name, self._buf, self._scanned = match.group(1), self._buf[match.end():], 0
        while self._scanned < len(self._buf) and not self._args_done:
            self._scan(self._buf[self._scanned])
            self._scanned += 1
        if not self._args_done:
            return False
        close = self._buf.find(CALL_CLOSE, self._scanned)
        if close < 0:
            return False
        call = ToolCall(len(self.calls), self._name, arguments=self._buf[:self._scanned])
        self.calls.append(call)
        events += [ParseEvent(call=call), ParseEvent(call=call, fragment=call.arguments),
                   ParseEvent(call=call, done=True)]
        self._buf = self._buf[close + len(CALL_CLOSE):]
        self._in_call, self._name, self._scanned, self._after_call = False, None, 0, True
        self._depth, self._args_done = 0, False
        return True

    def _scan(self, char: str) -> None:
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            self._args_done = self._depth == 0


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_all(text: str) -> tuple[str, list[ToolCall]]:
    """Content text and (complete) calls of a whole answer."""
    parser = ToolCallParser()
    events = parser.feed(text) + parser.finish()
    return "".join(e.text for e in events), parser.calls
