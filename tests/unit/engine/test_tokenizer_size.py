"""Admission checks token ids against the tokenizer's size once per engine, not once per request: ``len()`` of
a fast tokenizer rebuilds its vocabulary (~20 ms for SmolLM2's 49k), and admission runs on the event loop,
where every stream waited for it (py-spy of an idle server: most of the loop's time)."""

from __future__ import annotations

import pytest
from conftest import EngineFactory, LetterTokenizer

from homeai.api.admission import LLMRequest, prompt_ids_of
from homeai.api.errors import BadRequest
from homeai.api.tools import AnswerShape, plan_tools
from homeai.core.types import SamplingParams


class CountingTokenizer(LetterTokenizer):
    def __init__(self) -> None:
        self.lens = 0

    def __len__(self) -> int:
        self.lens += 1
        return 64


async def test_token_ids_are_checked_against_a_size_counted_once(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.tokenizer = tokenizer = CountingTokenizer()
    shape = AnswerShape(plan_tools([], None, None), None)
    for _ in range(3):
        request = LLMRequest(model=None, kind="completion", sampling=SamplingParams(), requested_max_tokens=4,
                             token_ids=[1, 2, 63], context_ids=[5])
        assert await prompt_ids_of(engine, request, shape) == [1, 2, 63]
    with pytest.raises(BadRequest, match=r"token id 64 .* outside the vocabulary \[0, 64\)"):
        await prompt_ids_of(engine, LLMRequest(model=None, kind="completion", sampling=SamplingParams(),
                                               requested_max_tokens=4, token_ids=[64]), shape)
    assert tokenizer.lens == 1
