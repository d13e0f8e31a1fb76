"""The tool-call parser: streamed in any pieces, it gives the same text and calls as read at once; a call
cut short (the budget, a stop string) is dropped, and no piece of the call syntax reaches the text. What
the three APIs make of a cut answer: OpenAI finish_reason "length", a Responses answer "incomplete"
without the call, Ollama without the call."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import ChatCompletionRequest, FunctionTool, ResponsesFunctionTool
from homeai.api.openai_stream import chat_message, finish_reason
from homeai.api.responses_output import OutputItems
from homeai.api.tool_calls import ToolCallParser, parse_all
from homeai.api.tools import ToolSpec, call_text, parse_tools, plan_tools
from homeai.core.types import FinishReason

ANSWER = ("Sure. " + call_text("HassTurnOn", {"name": "kitchen light", "area": {"id": "k}"}})
          + "\n" + call_text("HassLightSet", {"brightness": 50}) + " done <tool")


def test_whole_answer() -> None:
    text, calls = parse_all(ANSWER)
    assert text == "Sure. done "  # the "<tool" at the end is the start of a call tag: dropped
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
    assert "".join(e.text for e in events) == "Sure. done "
    starts = [e.call.name for e in events if e.call is not None and not e.fragment and not e.done]
    assert starts == ["HassTurnOn", "HassLightSet"]
    whole = parse_all(ANSWER)[1]
    for call, ref in zip(parser.calls, whole, strict=True):
        fragments = "".join(e.fragment for e in events if e.call is call)
        assert fragments == call.arguments == ref.arguments


def test_tool_choice() -> None:
    tools = [*parse_tools(msgspec.convert([{"type": "function", "function": {"name": "a"}}], list[FunctionTool])),
             *parse_tools(msgspec.convert([{"type": "function", "name": "b", "parameters": {"type": "object"}}],
                                          list[ResponsesFunctionTool]))]
    assert plan_tools(tools, None, None).mode == "auto"
    assert plan_tools([], None, None).active is False
    named = plan_tools(tools, {"type": "function", "function": {"name": "b"}}, False)
    assert named.mode == "required" and named.allowed == [tools[1]] and not named.parallel
    assert plan_tools(tools, "none", None).constraint() is None
    with pytest.raises(BadRequest) as err:
        plan_tools(tools, {"type": "function", "function": {"name": "c"}}, None)
    assert err.value.param == "tool_choice"
    with pytest.raises(msgspec.ValidationError, match=r"tools\[0\]\.type"):  # a 400 naming the field
        msgspec.convert({"model": "m", "messages": [{"role": "user"}], "tools": [{"type": "code_interpreter"}]},
                        ChatCompletionRequest)
    with pytest.raises(BadRequest) as err:
        parse_tools(msgspec.convert([{"function": {"name": "a"}}, {"function": {"name": "a"}}], list[FunctionTool]))
    assert err.value.param == "tools"
    assert tools[0] == ToolSpec("a")


def test_strings_may_hold_braces_and_the_closing_tag() -> None:
    answer = call_text("HassTurnOn", {"name": 'kitchen}</tool_call>#"x\\'}) + "after"
    for pieces in ([answer], list(answer)):
        parser = ToolCallParser()
        events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
        assert json.loads(parser.calls[0].arguments) == {"name": 'kitchen}</tool_call>#"x\\'}
        assert "".join(e.fragment for e in events) == parser.calls[0].arguments
        assert "".join(e.text for e in events) == "after"


CUT = ["Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2", "Hi <tool_call>{\"na", "Hi <tool_c",
       "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_c",
       "Hi " + call_text("f", {"a": 1}) + "\n<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \""]


@pytest.mark.parametrize("answer", CUT)
def test_a_call_cut_short_is_dropped_and_none_of_its_syntax_is_text(answer: str) -> None:
    complete = answer.count("</tool_call>")
    text, calls = parse_all(answer)
    assert text == "Hi " and len(calls) == complete
    for pieces in (list(answer), [answer[:7], answer[7:]]):
        parser = ToolCallParser()
        events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
        assert "".join(e.text for e in events) == "Hi " and parser.dropped
        assert len([e for e in events if e.call is not None]) == 3 * complete  # start, arguments, done
        assert all(json.loads(c.arguments) == {"a": 1} for c in parser.calls)


def test_forced_choices_end_after_one_call() -> None:
    tools = parse_tools(msgspec.convert([{"type": "function", "function": {"name": n}} for n in ("a", "b")],
                                        list[FunctionTool]))
    named = {"type": "function", "function": {"name": "b"}}
    for choice, parallel in (("required", True), ("required", None), (named, True), (named, False)):
        fmt = json.loads(plan_tools(tools, choice, parallel).constraint().spec)["format"]  # type: ignore[union-attr]
        assert fmt["type"] == "tags_with_separator" and fmt["stop_after_first"] is True
    auto = json.loads(plan_tools(tools, "auto", True).constraint().spec)["format"]  # type: ignore[union-attr]
    assert auto["type"] == "triggered_tags" and auto["stop_after_first"] is False


def test_what_each_api_makes_of_a_cut_call() -> None:
    answer = "Sure <tool_call>{\"name\": \"HassTurnOn\", \"arguments\": {\"name\": \"kitch"
    message, called = chat_message(answer, reads_calls=True)
    assert message.content == "Sure " and not message.tool_calls and not called
    assert finish_reason(FinishReason.LENGTH, called) == "length"
    items, parser = OutputItems("r1"), ToolCallParser()
    events = [e for piece in answer for e in items.feed(parser.feed(piece), False)]
    events += items.feed(parser.finish(), True, FinishReason.LENGTH)
    assert not any(fields.get("item", {}).get("type") == "function_call" for _, fields in events)
    done = [fields["item"] for kind, fields in events if kind == "response.output_item.done"]
    assert [item["status"] for item in done] == ["incomplete"]  # as the final response says (was "completed")
    output = items.output(FinishReason.LENGTH)
    assert [(i["type"], i["status"]) for i in output] == [("message", "incomplete")]
    assert output[0]["content"][0]["text"] == "Sure "
    whole, parser = OutputItems("r2"), ToolCallParser()
    whole.feed(parser.feed(call_text("HassTurnOn", {"name": "hall"}) + "\n" + answer.removeprefix("Sure "))
               + parser.finish(), True)
    assert [(i["type"], i["status"], i.get("arguments")) for i in whole.output(FinishReason.LENGTH)] == [
        ("function_call", "completed", '{"name": "hall"}')]
