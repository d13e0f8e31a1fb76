"""The tool-call parser: streamed in any pieces, it gives the same text and calls as read at once."""

from __future__ import annotations

import json
import random

import pytest

from homeai.api.errors import BadRequest
from homeai.api.tool_calls import ToolCallParser, parse_all
from homeai.api.tools import ToolSpec, call_text, parse_tools, plan_tools

ANSWER = ("Sure. " + call_text("HassTurnOn", {"name": "kitchen light", "area": {"id": "k}"}})
          + "\n" + call_text("HassLightSet", {"brightness": 50}) + " done <tool")


def test_whole_answer() -> None:
    text, calls = parse_all(ANSWER)
    assert text == "Sure. done <tool"
    assert [c.name for c in calls] == ["HassTurnOn", "HassLightSet"]
    assert calls[0].arguments_object() == {"name": "kitchen light", "area": {"id": "k}"}}
    assert json.loads(calls[1].arguments) == {"brightness": 50}


@pytest.mark.parametrize("seed", range(20))
def test_streamed_in_random_pieces_reassembles(seed: int) -> None:
    rng = random.Random(seed)
    parser, cuts, events = ToolCallParser(), sorted(rng.sample(range(1, len(ANSWER)), 30)), []
    for a, b in zip([0, *cuts], [*cuts, len(ANSWER)], strict=True):
        events += parser.feed(ANSWER[a:b])
    events += parser.finish()
    assert "".join(e.text for e in events) == "Sure. done <tool"
    starts = [e.call.name for e in events if e.call is not None and not e.fragment and not e.done]
    assert starts == ["HassTurnOn", "HassLightSet"]
    whole = parse_all(ANSWER)[1]
    for call, ref in zip(parser.calls, whole, strict=True):
        fragments = "".join(e.fragment for e in events if e.call is call)
        assert fragments == call.arguments == ref.arguments


def test_tool_choice() -> None:
    tools = parse_tools([{"type": "function", "function": {"name": "a"}}, {"type": "function", "name": "b",
                                                                          "parameters": {"type": "object"}}])
    assert plan_tools(tools, None, None).mode == "auto"
    assert plan_tools([], None, None).active is False
    named = plan_tools(tools, {"type": "function", "function": {"name": "b"}}, False)
    assert named.mode == "required" and named.allowed == [tools[1]] and not named.parallel
    assert plan_tools(tools, "none", None).constraint() is None
    with pytest.raises(BadRequest) as err:
        plan_tools(tools, {"type": "function", "function": {"name": "c"}}, None)
    assert err.value.param == "tool_choice"
    with pytest.raises(BadRequest):
        parse_tools([{"type": "code_interpreter"}])
    assert tools[0] == ToolSpec("a")


def test_strings_may_hold_braces_and_the_closing_tag() -> None:
    answer = call_text("HassTurnOn", {"name": 'kitchen}</tool_call>#"x\\'}) + "after"
    for pieces in ([answer], list(answer)):
        parser = ToolCallParser()
        events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
        assert json.loads(parser.calls[0].arguments) == {"name": 'kitchen}</tool_call>#"x\\'}
        assert "".join(e.fragment for e in events) == parser.calls[0].arguments
        assert "".join(e.text for e in events) == "after"


def test_a_call_cut_short_keeps_what_came() -> None:
    text, calls = parse_all('Hi <tool_call>{"name": "f", "arguments": {"a": [1, 2')
    assert text == "Hi " and calls[0].name == "f" and calls[0].arguments == '{"a": [1, 2'
    assert calls[0].arguments_object() == '{"a": [1, 2'
