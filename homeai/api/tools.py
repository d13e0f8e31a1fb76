"""Function tools, the same for OpenAI chat, Responses and Ollama: what the model is told, what it may emit.

A call is written ``<tool_call>{"name": "<function>", "arguments": {...}}</tool_call>`` (the Hermes /
Qwen format that SmolLM2 and most small models learnt). A model whose chat template has a tools section
gets the tools through its template; any other template gets ``TOOLS_SYSTEM_PROMPT`` in the system
message. Earlier calls and tool results are written back in the same format (results inside
``<tool_response>`` in a user turn), so every template can show them.

Calls are enforced by a grammar (xgrammar's structural tag): with ``tool_choice`` "required" or a
named function the answer is exactly one call to an allowed function whose arguments validate against
its JSON Schema, and the grammar ends after it (``parallel_tool_calls`` or not: a second call could only
be cut by the budget); with "auto" the model may write text, and a call it starts is held to the same
grammar (several with ``parallel_tool_calls``). "none" hides the tools from the model. The sampler
closes a call in time before ``max_tokens`` (``homeai.runtime.grammar``), and a forced call whose
shortest form does not fit is not started (``homeai.api.routing.Generation``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import EarlierCall, FunctionTool, ResponsesFunctionTool
from homeai.api.schema_rules import check_schema, object_only
from homeai.core.types import Constraint, ConstraintKind

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_HEAD = '<tool_call>{"name": "%s", "arguments": '
TOOLS_SYSTEM_PROMPT = (
    "You can call functions. Their signatures are JSON inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with a JSON object holding its name and arguments inside "
    "<tool_call></tool_call> tags, exactly like this:\n"
    '<tool_call>{{"name": "<function-name>", "arguments": <arguments-json-object>}}</tool_call>\n'
    "A function's result comes back to you inside <tool_response></tool_response>."
)
ToolMode = Literal["none", "auto", "required"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request asks of tools: the tools the model sees, those it may call, and whether it must."""

    tools: list[ToolSpec]
    mode: ToolMode
    allowed: list[ToolSpec]
    parallel: bool = True

    @property
    def active(self) -> bool:
        return self.mode != "none" and bool(self.allowed)

    def constraint(self) -> Constraint | None:
        """The grammar of the answer: one call and nothing else (required), or text with constrained
        calls (auto)."""
        if not self.active:
            return None
        tags = [{"begin": CALL_HEAD % t.name, "content": {"type": "json_schema", "json_schema": t.parameters},
                 "end": "}" + CALL_CLOSE} for t in self.allowed]
        fmt: dict[str, Any] = {"tags": tags, "at_least_one": True, "stop_after_first": not self.parallel}
        if self.mode == "required":  # one call, then the end
            fmt |= {"type": "tags_with_separator", "separator": "\n", "stop_after_first": True}
        else:  # text, and a call once the model writes <tool_call>
            fmt |= {"type": "triggered_tags", "triggers": [CALL_OPEN], "at_least_one": False}
        return Constraint(ConstraintKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": fmt},
                                                                    sort_keys=True))


def parse_tools(tools: Sequence[FunctionTool | ResponsesFunctionTool] | None, field_name: str = "tools") \
        -> list[ToolSpec]:
    """The request's function tools (typed by their schemas: chat and Ollama nest the function, Responses
    puts its fields beside the type), with names a call can be written with and no two alike."""
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools or []):
        fn = tool.function if isinstance(tool, FunctionTool) else tool
        where = f"{field_name}[{i}].function.name" if isinstance(tool, FunctionTool) else f"{field_name}[{i}].name"
        if not fn.name or '"' in fn.name or "\\" in fn.name:
            raise BadRequest("a function tool needs a name (no quotes or backslashes)", param=where)
        params = fn.parameters or {"type": "object", "properties": {}}
        field = f"{field_name}[{i}].function.parameters" if isinstance(tool, FunctionTool) \
            else f"{field_name}[{i}].parameters"
        if not object_only(params):  # a call's arguments are one object: a string or null was never read
            raise BadRequest("a function's parameters must be the JSON Schema of an object (\"type\": \"object\")",
                             param=field)
        check_schema(params, field)  # the arguments are generated under it as response_format's are: same refusals
        specs.append(ToolSpec(fn.name, fn.description or "", params))
    if len({s.name for s in specs}) != len(specs):
        raise BadRequest("two tools share a name", param=field_name)
    return specs


def plan_tools(tools: list[ToolSpec], choice: Any, parallel: bool | None, field_name: str = "tool_choice") -> ToolPlan:
    """Resolve ``tool_choice`` (none / auto / required / a named function) against the tools."""
    parallel = True if parallel is None else parallel
    if choice is None:
        return ToolPlan(tools, "auto" if tools else "none", tools, parallel)
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise BadRequest("tool_choice 'required' needs tools", param=field_name)
        return ToolPlan(tools, choice, tools, parallel)
    name = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
    if not isinstance(name, str):
        raise BadRequest("tool_choice must be none, auto, required or a function by name", param=field_name)
    named = [t for t in tools if t.name == name]
    if not named:
        raise BadRequest(f"tool_choice names {name!r}, which is not among the tools", param=field_name)
    return ToolPlan(tools, "required", named, parallel)


def class_tool_choice(choice: Any, class_choice: str, user_spoke_last: bool) -> Any:
    """The request's ``tool_choice``, else its class's. A class's "required" holds while the user spoke
    last; after a tool result it is "none", so the model answers in words (else it would call forever)."""
    if choice is not None or class_choice != "required":
        return choice
    return "required" if user_spoke_last else "none"


@dataclass(slots=True)
class AnswerShape:
    """What an answer may be, settled once the class is known: the tool plan and the grammar with the
    request field it came from (``None``: free text)."""

    plan: ToolPlan
    constraint: tuple[Constraint, str] | None


def answer_shape(specs: list[ToolSpec], choice: Any, parallel: bool | None,
                 fmt: tuple[Constraint, str] | None, class_choice: str, user_spoke_last: bool) -> AnswerShape:
    """Tools or a response format, not both (a call is no JSON document of the requested shape)."""
    chosen = class_tool_choice(choice, class_choice, user_spoke_last) if specs else choice
    if chosen is not choice and parallel is None:  # the class's "required" asks for one call a turn
        parallel = False
    plan = plan_tools(specs, chosen, parallel)
    if plan.active and fmt is not None:
        field = fmt[1].removesuffix(".json_schema.schema").removesuffix(".schema")  # the format itself
        raise BadRequest(f"{field} cannot be combined with callable tools; send tool_choice 'none' or no {field}",
                         param=field)
    grammar = plan.constraint()
    return AnswerShape(plan, (grammar, "tools") if grammar is not None else fmt)


def call_text(name: str, arguments: Any) -> str:
    """A call as the model writes it (``arguments``: an object or its JSON text)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return (CALL_HEAD % name) + args + "}" + CALL_CLOSE


def tools_system_prompt(tools: list[ToolSpec]) -> str:
    return TOOLS_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t.as_openai()) for t in tools))


def with_tools_prompt(messages: list[dict[str, Any]], tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Messages for a template without a tools section: the tools go first in the system message."""
    if not tools:
        return messages
    prompt = tools_system_prompt(tools)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def tool_result_message(content: str) -> dict[str, str]:
    """A tool's result, as a user turn every template accepts."""
    return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}


def earlier_calls(calls: Sequence[EarlierCall]) -> list[tuple[str, Any]]:
    """(name, arguments) of the calls an earlier assistant turn made (arguments: JSON text or an object)."""
    return [(c.function.name, c.function.arguments or "{}") for c in calls]


def assistant_calls_message(content: str, calls: list[tuple[str, Any]]) -> dict[str, str]:
    """An earlier assistant turn with its calls written back as the model wrote them."""
    text = "".join(call_text(name, args) for name, args in calls)
    return {"role": "assistant", "content": (content + "\n" if content else "") + text}
