"""Chunks are windows of tokens (size, overlap), cut at token boundaries of the original text."""

from __future__ import annotations

from pathlib import Path

import pytest

from homeai.jobs.chunking import chunk_text, hf_token_offsets, word_offsets


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_windows_overlap_and_the_last_one_ends_at_the_last_token() -> None:
    chunks = chunk_text(words(10), word_offsets, size_tokens=4, overlap_tokens=1)
    assert [c.text for c in chunks] == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert [c.num_tokens for c in chunks] == [4, 4, 4]
    chunks = chunk_text(words(11), word_offsets, size_tokens=4, overlap_tokens=1)
    assert chunks[-1].text == "w9 w10" and chunks[-1].num_tokens == 2


def test_short_and_empty_texts() -> None:
    assert chunk_text("", word_offsets, 4, 1) == []
    assert chunk_text("   \n\t ", word_offsets, 4, 1) == []
    (only,) = chunk_text("one two", word_offsets, 200, 40)
    assert only.text == "one two" and only.num_tokens == 2
    # exactly one window: no second window that would only repeat the overlap
    assert len(chunk_text(words(4), word_offsets, 4, 2)) == 1


def test_every_token_is_covered_and_text_is_original() -> None:
    text = "Alpha,  beta\n\ngamma — délta épsilon " * 30
    chunks = chunk_text(text, word_offsets, size_tokens=16, overlap_tokens=4)
    joined_tokens = [t for c in chunks for t in c.text.split()]
    assert all(c.text in text for c in chunks)
    assert sum(c.num_tokens for c in chunks) == len(joined_tokens)
    assert len(set(joined_tokens)) == len(set(text.split()))
    assert all(c.num_tokens <= 16 for c in chunks)


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_bad_sizes(size: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_text("a b c", word_offsets, size, overlap)


@pytest.mark.slow
def test_counts_tokens_of_the_embedding_model(pulled_models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pulled_models["all-minilm-l6-v2"])
    tokenizer(["x " * 600], truncation=True, max_length=256)  # the shared tokenizer is set to truncate
    offsets = hf_token_offsets(tokenizer)
    text = "Tokenization splits unbelievable words into pieces. " * 80
    chunks = chunk_text(text, offsets, size_tokens=200, overlap_tokens=40)
    total = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert total > 256 and len(chunks) == 1 + -(-(total - 200) // 160)
    for chunk in chunks:
        assert chunk.num_tokens <= 200
        assert abs(len(tokenizer(chunk.text, add_special_tokens=False)["input_ids"]) - chunk.num_tokens) <= 2
