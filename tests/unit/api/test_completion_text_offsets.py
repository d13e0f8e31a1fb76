"""/v1/completions' ``text_offset``: the characters of text before each token, counted from the bytes of the
tokens before it. A character split over tokens (each alone decodes to U+FFFD) counted one per token, so
every offset after it pointed at the wrong character; streamed, the tokens of text held back for a possible
stop string all reported the offset where the hold began."""

from __future__ import annotations

from pathlib import Path

from homeai.api.logprobs import completion_logprobs
from homeai.core.types import TokenLogprob
from homeai.engine.builder import load_tokenizer


def test_offsets_count_characters_not_tokens(pulled_models: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(pulled_models["smollm2-135m-instruct"])
    text = "文章です。 Hello"
    ids = tokenizer.encode(text, add_special_tokens=False)
    offsets = completion_logprobs([TokenLogprob(i, -0.5) for i in ids], tokenizer, offset=3)["text_offset"]
    assert len(ids) > len(text) - len(" Hello") + 1  # some character is split over tokens
    starts = [text.index(ch) for ch in "文章です。"] + [text.index(" Hello")]
    assert sorted(set(offsets)) == [3 + s for s in starts] and offsets == sorted(offsets)
    assert offsets[-1] == 3 + text.index(" Hello")
