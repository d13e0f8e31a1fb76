"""How tools reach the prompt: through a template's tools section, else the documented system prompt;
and which tool_choice a class's policy gives a request that does not choose."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from transformers import PreTrainedTokenizerBase

from homeai.api.errors import BadRequest
from homeai.api.openai_schemas import FunctionTool
from homeai.api.structured import JSON_OBJECT
from homeai.api.tools import (
    TOOLS_SYSTEM_PROMPT,
    answer_shape,
    call_text,
    class_tool_choice,
    parse_tools,
    tool_result_message,
    with_tools_prompt,
)
from homeai.engine.builder import chat_prompt_ids, load_tokenizer, template_has_tools
from homeai.policy.loader import load_policy

TOOLS = parse_tools(msgspec.convert([{"type": "function", "function": {"name": "HassTurnOn",
                                                                       "parameters": {"type": "object"}}}],
                                    list[FunctionTool]))
TOOLS_TEMPLATE = ("{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
                  "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")


@pytest.fixture(scope="module")
def tokenizer(pulled_models: dict[str, Path]) -> PreTrainedTokenizerBase:
    return load_tokenizer(pulled_models["smollm2-135m-instruct"])


def test_template_without_tools_gets_the_system_prompt(tokenizer: PreTrainedTokenizerBase) -> None:
    assert not template_has_tools(tokenizer)  # SmolLM2's template has no tools section
    messages = with_tools_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                                 TOOLS)
    assert messages[0]["content"].startswith("Be brief.\n\nYou can call functions.") and len(messages) == 2
    assert '"name": "HassTurnOn"' in messages[0]["content"]
    text = tokenizer.decode(chat_prompt_ids(tokenizer, messages))
    assert "<tools>" in text and "<tool_call>" in text
    assert with_tools_prompt([{"role": "user", "content": "hi"}], TOOLS)[0]["role"] == "system"
    assert TOOLS_SYSTEM_PROMPT.count("{tools}") == 1


def test_template_with_a_tools_section_renders_them(tokenizer: PreTrainedTokenizerBase) -> None:
    original = tokenizer.chat_template
    tokenizer.chat_template = TOOLS_TEMPLATE
    try:
        assert template_has_tools(tokenizer)
        text = tokenizer.decode(chat_prompt_ids(tokenizer, [{"role": "user", "content": "hi"}],
                                                [t.as_openai() for t in TOOLS]))
        assert text.startswith("TOOLS:HassTurnOn;")
    finally:
        tokenizer.chat_template = original


def test_calls_and_results_are_written_as_the_model_reads_them() -> None:
    assert call_text("f", {"a": 1}) == '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    assert tool_result_message("ok") == {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}


def test_class_tool_choice() -> None:
    assert class_tool_choice(None, "auto", True) is None
    assert class_tool_choice(None, "required", True) == "required"
    assert class_tool_choice(None, "required", False) == "none"  # after a tool result: words
    assert class_tool_choice("auto", "required", True) == "auto"  # the request's own choice wins
    shape = answer_shape(TOOLS, None, None, None, "required", True)
    assert shape.plan.mode == "required" and not shape.plan.parallel and shape.constraint is not None
    assert answer_shape([], None, None, (JSON_OBJECT, "format"), "required", True).constraint == (JSON_OBJECT,
                                                                                                  "format")
    with pytest.raises(BadRequest) as err:
        answer_shape(TOOLS, None, None, (JSON_OBJECT, "response_format.json_schema.schema"),
                     "auto", True)
    assert err.value.param == "response_format"


def test_the_default_policy_makes_the_voice_class_call() -> None:
    """SmolLM2-135M almost never calls a tool by itself: the voice class's requests that bring tools
    without choosing (every Ollama one) must call while the user spoke last."""
    policy = load_policy(Path(__file__).parents[3] / "policies" / "default.yaml")
    assert policy.classes["voice"].tool_choice == "required"
    assert policy.classes["chat"].tool_choice == "auto"
