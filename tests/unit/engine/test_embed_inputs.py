"""An embedding request's inputs become token rows: texts tokenized, rows checked, one kind per request."""

from __future__ import annotations

import pytest

from homeai.engine.embed_service import token_rows
from homeai.engine.errors import RequestError


class WordEmbedder:
    """Tokenizes a text as one id per word (its length); rows up to ``max_length`` ids."""

    max_length = 4

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [[len(word) for word in text.split()] for text in texts]


def test_texts_are_tokenized() -> None:
    assert token_rows(WordEmbedder(), ["a bb", "ccc"]) == [[1, 2], [3]]  # type: ignore[arg-type]


def test_token_rows_are_checked_against_the_models_length() -> None:
    assert token_rows(WordEmbedder(), [[5, 6], [7]]) == [[5, 6], [7]]  # type: ignore[arg-type]
    with pytest.raises(RequestError, match=r"input\[1\] has 5 tokens"):
        token_rows(WordEmbedder(), [[1], [1, 2, 3, 4, 5]])  # type: ignore[arg-type]
    with pytest.raises(RequestError, match=r"input\[0\] has 0 tokens"):
        token_rows(WordEmbedder(), [[]])  # type: ignore[arg-type]


def test_a_text_among_token_rows_is_refused_not_read_as_characters() -> None:
    with pytest.raises(RequestError, match="mixes texts and token ids"):
        token_rows(WordEmbedder(), [[5, 6], "hello"])  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="empty"):
        token_rows(WordEmbedder(), [])  # type: ignore[arg-type]
