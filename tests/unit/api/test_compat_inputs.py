"""What OpenAI- and Ollama-compatible clients send that must not be dropped silently, and the prompt a
text completion gets (found by a review of the compatible surface)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from homeai.api.admission import LLMRequest, prompt_ids_of
from homeai.api.errors import BadRequest
from homeai.api.openai_chat import chat_request, completion_request
from homeai.api.openai_schemas import ChatCompletionRequest, CompletionRequest
from homeai.api.tools import AnswerShape, plan_tools
from homeai.core.types import SamplingParams
from homeai.runtime.gguf_tokenizer import gguf_tokenizer

# A Llama-3-style tokenizer as a GGUF describes it: it puts <|begin_of_text|> first (add_bos_token).
LLAMA3_META = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["<|begin_of_text|>", "<|eot_id|>", "h", "i",
                                                                          "Ġ", "hi"],
               "tokenizer.ggml.merges": ["h i"], "tokenizer.ggml.token_type": [3, 3, 1, 1, 1, 1],
               "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": True,
               "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}


def _text_request(text: str, context: list[int] | None = None) -> LLMRequest:
    return LLMRequest(model=None, kind="completion", sampling=SamplingParams(), requested_max_tokens=4, text=text,
                      context_ids=context or [])


async def test_a_text_prompt_starts_with_the_models_bos() -> None:
    """vLLM's completions and Ollama's runner encode a raw prompt with the model's special tokens. Before:
    /v1/completions and raw /api/generate sent Llama 3 its prompt without <|begin_of_text|>."""
    tokenizer = gguf_tokenizer(LLAMA3_META)
    engine = SimpleNamespace(tokenizer=tokenizer, tokenizer_size=len(tokenizer))
    shape = AnswerShape(plan_tools([], None, None), None)
    assert await prompt_ids_of(engine, _text_request("hi"), shape) == [0, 5]  # type: ignore[arg-type]
    # already there, or going on from an earlier answer's ids: not a second one
    assert await prompt_ids_of(engine, _text_request("<|begin_of_text|>hi"), shape) == [0, 5]  # type: ignore[arg-type]
    assert await prompt_ids_of(engine, _text_request("hi", context=[0, 5]), shape) == [5]  # type: ignore[arg-type]


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "def f(", "suffix": "    return x"}, "suffix"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
])
def test_completion_fields_we_cannot_honour_are_refused(body: dict[str, Any], param: str) -> None:
    """Before: msgspec dropped suffix and best_of, and the answer ignored them."""
    data = msgspec.convert({"model": "m", **body}, CompletionRequest)
    with pytest.raises(BadRequest) as refused:
        completion_request(data)
    assert refused.value.param == param
    completion_request(msgspec.convert({"model": "m", "prompt": "hi", "suffix": "", "best_of": 1},
                                       CompletionRequest))  # their neutral values are fine


@pytest.mark.parametrize("legacy", ["functions", "function_call"])
def test_legacy_function_calling_is_refused_naming_the_field(legacy: str) -> None:
    """Before: a client of the deprecated functions / function_call got plain text, never a call, and no error."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            legacy: [{"name": "f", "parameters": {}}] if legacy == "functions" else "auto"}
    with pytest.raises(BadRequest, match="tools") as refused:
        chat_request(msgspec.convert(body, ChatCompletionRequest))
    assert refused.value.param == legacy
