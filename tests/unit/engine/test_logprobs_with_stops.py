"""Logprobs go out with the text their tokens made: a token whose text the detokenizer holds (it may begin
a stop string) sends its logprob when that text is released, and a stop string's tokens, whose text is cut,
send none. They went out at once: the answer ended with text-less chunks carrying the stop string's tokens,
and the logprob tokens no longer spelled the content."""

from __future__ import annotations

from conftest import EngineFactory, LetterTokenizer
from engine_helpers import assert_engine_empty

from homeai.core.types import SamplingParams, TokenDelta
from homeai.engine.llm_engine import LLMEngine


def run(engine: LLMEngine, prompt: list[int], stop: list[str]) -> list[TokenDelta]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=stop, logprobs=0)
    engine.scheduler.add(engine.make_sequence(prompt, params))
    deltas: list[TokenDelta] = []
    while engine.scheduler.has_work():
        deltas += engine.step()
    return deltas


def test_logprobs_spell_the_text_they_go_out_with_and_a_stop_strings_tokens_have_none(
        make_engine: EngineFactory) -> None:
    engine = make_engine()
    letters = LetterTokenizer().decode
    prompt = [3, 14, 15, 9, 2, 6]
    free = "".join(d.text for d in run(engine, prompt, []))
    stop = free[4:6]  # two tokens' letters: the first is held, the second completes it
    assert stop not in free[:5], "pick a stop string that first occurs at 4"
    deltas = run(engine, prompt, [stop])
    assert "".join(d.text for d in deltas) == free[:4]
    for d in deltas:
        assert letters([lp.token_id for lp in d.logprobs]) == d.text
    assert_engine_empty(engine)
