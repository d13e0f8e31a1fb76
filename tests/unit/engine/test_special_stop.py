"""A stop string that is a special token (Ollama clients send "<|im_start|>") stops on that token: the
detokenizer leaves special tokens out of the text it scans for stop strings, so it never matched, and the
model went on to write a made-up next turn."""

from __future__ import annotations

from conftest import LetterTokenizer, build_tiny_engine

from homeai.core.sequence import SequenceStatus
from homeai.core.types import SamplingParams
from homeai.engine.llm_engine import LLMEngine
from homeai.runtime.llama import LlamaModel

SPECIAL = 7  # the token the tokenizer below calls "<|im_start|>" (special: left out of decoded text)


class ChatTokenizer(LetterTokenizer):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return super().decode([t for t in token_ids if not (skip_special_tokens and t == SPECIAL)])

    def get_added_vocab(self) -> dict[str, int]:
        return {"<|im_start|>": SPECIAL, "<plain>": 9}


def test_a_stop_string_that_is_a_special_token_stops_on_it(tiny_model: LlamaModel) -> None:
    tiny = build_tiny_engine(tiny_model)
    engine = LLMEngine(tiny.runner, tiny.scheduler, ChatTokenizer(), [], tiny.max_model_len)
    seq = engine.make_sequence([3, 4], SamplingParams(max_tokens=4, stop=["<|im_start|>", "<plain>"],
                                                      stop_token_ids=[11]))
    assert seq.params.stop_token_ids == [11, SPECIAL]  # "<plain>" decodes to text: found as a stop string
    assert seq.append_token(5) is None
    assert seq.append_token(SPECIAL) == SequenceStatus.FINISHED_STOPPED
