"""Reads the model's calls out of its text as it streams: text, then for each call its name and
argument fragments, in the order OpenAI streams them.

The grammar fixes the layout (``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``), so the
name is known once its header is complete, and the arguments are the JSON value after it, read by a
small scanner (a string may hold "}" or "</tool_call>"). A streamed answer and the same answer read
at once give the same events joined, because both go through this one parser.
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
    an argument ``fragment`` of ``call``, or a call completed (``done``)."""

    text: str = ""
    call: ToolCall | None = None
    fragment: str = ""
    done: bool = False


class ToolCallParser:
    """Feed text deltas, get events; ``finish`` flushes what was held back at the end of the answer."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._call: ToolCall | None = None
        self._in_call = False
        self._sent = 0  # argument characters of the current call already sent
        self._after_call = False  # whitespace right after a call is layout, not content
        self._depth, self._in_string, self._escaped, self._args_done = 0, False, False, False  # JSON scan

    def feed(self, text: str) -> list[ParseEvent]:
        self._buf += text
        events: list[ParseEvent] = []
        while True:
            before = len(events)
            if not self._in_call:
                self._read_text(events)
            elif self._call is None:
                self._read_head(events)
            else:
                self._read_arguments(events)
            if len(events) == before and not self._progressed:
                return events

    def finish(self) -> list[ParseEvent]:
        """The rest: held-back text, or the arguments of a call cut short (max_tokens)."""
        events: list[ParseEvent] = []
        if self._call is not None:  # cut short: what was scanned is all the arguments there are
            events.append(ParseEvent(call=self._call, done=True))
        elif self._buf and not (self._after_call and self._buf.isspace()):
            events.append(ParseEvent(text=self._buf))
        self._buf, self._call, self._in_call, self._sent = "", None, False, 0
        self._depth, self._in_string, self._escaped, self._args_done = 0, False, False, False
        return events

    # ---- states ----------------------------------------------------------------------------------
    _progressed: bool = False

    def _read_text(self, events: list[ParseEvent]) -> None:
        self._progressed = False
        if self._after_call:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return
            self._after_call = False
        start = self._buf.find(CALL_OPEN)
        if start >= 0:
            if start:
                events.append(ParseEvent(text=self._buf[:start]))
            self._buf = self._buf[start + len(CALL_OPEN):]
            self._in_call, self._progressed = True, True
            return
        keep = _partial_suffix(self._buf, CALL_OPEN)  # "<tool" may become "<tool_call>"
        if len(self._buf) > keep:
            events.append(ParseEvent(text=self._buf[: len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep:]

    def _read_head(self, events: list[ParseEvent]) -> None:
        match = _HEAD.match(self._buf)
        self._progressed = False
        if match is None:
            return
        self._call = ToolCall(len(self.calls), match.group(1))
        self.calls.append(self._call)
        self._buf, self._sent = self._buf[match.end():], 0
        events.append(ParseEvent(call=self._call))
        self._progressed = True

    def _read_arguments(self, events: list[ParseEvent]) -> None:
        """Scan the arguments as JSON (strings may hold "}" or even "</tool_call>"); each scanned
        character is an argument fragment until the object closes, then ``}</tool_call>`` ends the call."""
        call = self._call
        assert call is not None
        self._progressed = False
        if not self._args_done:
            start = self._sent
            while self._sent < len(self._buf) and not self._args_done:
                self._scan(self._buf[self._sent])
                self._sent += 1
            if self._sent > start:
                fragment = self._buf[start:self._sent]
                call.arguments += fragment
                events.append(ParseEvent(call=call, fragment=fragment))
            if not self._args_done:
                return
        close = self._buf.find(CALL_CLOSE, self._sent)
        if close < 0:
            return
        events.append(ParseEvent(call=call, done=True))
        self._buf = self._buf[close + len(CALL_CLOSE):]
        self._call, self._in_call, self._sent, self._progressed = None, False, 0, True
        self._after_call, self._args_done, self._depth = True, False, 0

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
    """Content text and calls of a whole answer."""
    parser = ToolCallParser()
    events = parser.feed(text) + parser.finish()
    return "".join(e.text for e in events), parser.calls
