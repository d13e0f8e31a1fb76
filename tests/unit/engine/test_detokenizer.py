"""Streaming detokenizing against real tokenizers built here (no downloads): byte-level BPE (GPT-2 /
SmolLM style) and a SentencePiece-like BPE with byte fallback and a Metaspace decoder (Llama style)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from homeai.engine.detokenizer import IncrementalDetokenizer

CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog. STOP here please.",
    "안녕하세요 세계, 한국어 문장도 조금 있습니다.",
    "Emoji time 🙂🚀 and café, naïve, Grüße, 日本語のテキスト.",
] * 20

TEXTS = [
    "Hello world, 안녕하세요! 🙂🚀 café 日本語 done.",
    "한국어 문장은 바이트가 여러 개입니다 🧑‍🚀 and more",
    "   leading spaces and\nnewlines\n\n  then words",
    "unknown Ω≈ç√ symbols ✓ ✗ 𝔘𝔫𝔦",
]


def byte_level_bpe() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", clean_up_tokenization_spaces=False
    )


def sentencepiece_like() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    english = [line for line in CORPUS if line.isascii()]
    tok.train_from_iterator(english, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<eos>"]))
    spec = json.loads(tok.to_str())  # add the 256 byte tokens, as SentencePiece's byte_fallback does
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", clean_up_tokenization_spaces=False
    )


TOKENIZERS = {"byte_level": byte_level_bpe(), "sentencepiece": sentencepiece_like()}


@pytest.fixture(params=list(TOKENIZERS))
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return TOKENIZERS[request.param]


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stream(tokenizer, prompt: list[int], output: list[int], stop: list[str]) -> tuple[list[str], str, bool]:
    """Push every token; returns the pieces (flush last), the emitted text, and whether it stopped."""
    detok = IncrementalDetokenizer(tokenizer, prompt, stop)
    pieces = []
    for token_id in output:
        pieces.append(detok.push(token_id))
        if detok.stopped:
            break
    pieces.append(detok.flush())
    assert "".join(pieces) == detok.text
    return pieces, detok.text, detok.stopped


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_full_decode(tokenizer, text: str) -> None:
    prompt = encode(tokenizer, "Hello world,")
    output = encode(tokenizer, text)
    pieces, streamed, stopped = stream(tokenizer, prompt, output, stop=[])
    assert streamed == tokenizer.decode(prompt + output)[len(tokenizer.decode(prompt)) :]
    assert not stopped
    assert all("\ufffd" not in piece for piece in pieces)  # no broken character ever goes out


def test_characters_really_are_split_across_tokens(tokenizer) -> None:
    """Guards the test above: naive per-token decoding must break on this text."""
    ids = encode(tokenizer, TEXTS[0])
    naive = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in piece for piece in naive)
    assert "".join(naive) != tokenizer.decode(ids) or "\ufffd" in "".join(naive)


def test_leading_space_kept_in_context() -> None:
    tokenizer = TOKENIZERS["sentencepiece"]
    prompt, output = encode(tokenizer, "Hello"), encode(tokenizer, " world")
    assert tokenizer.decode(output) == "world"  # alone, the Metaspace decoder strips the space
    assert stream(tokenizer, prompt, output, stop=[])[1] == " world"


@pytest.mark.parametrize("stop", ["STOP", "fox jumps", "세요", "🚀 café", "!"])
def test_stop_string_spanning_tokens_is_never_leaked(tokenizer, stop: str) -> None:
    text = "The quick brown fox jumps over 안녕하세요! 🙂🚀 café STOP after"
    full = text + " and this must never show " + stop
    pieces, streamed, stopped = stream(tokenizer, [], encode(tokenizer, full), stop=["zzz", stop])
    assert stopped
    assert streamed == full[: full.index(stop)]
    assert pieces[-1] == ""  # flush after a stop gives nothing
    # Emitted text only grows, so equality above means no part of the stop string ever went out.


def test_stop_string_hold_back_and_release() -> None:
    tokenizer = TOKENIZERS["byte_level"]
    detok = IncrementalDetokenizer(tokenizer, [], stop=["ab!"])
    emitted = [detok.push(i) for i in encode(tokenizer, "x a")]
    assert "".join(emitted) == "x "  # "a" could begin "ab!": held
    emitted = [detok.push(i) for i in encode(tokenizer, "b")]
    assert "".join(emitted) == ""  # "ab" could still become "ab!"
    emitted = [detok.push(i) for i in encode(tokenizer, "c")]
    assert "".join(emitted) == "abc"  # not a stop after all: released
    assert not detok.stopped and detok.text == "x abc"


def test_partial_stop_prefix_flushed_at_finish(tokenizer) -> None:
    text = "Hello world, STO"
    pieces, streamed, stopped = stream(tokenizer, [], encode(tokenizer, text), stop=["STOP"])
    assert not stopped and streamed == text
    assert pieces[-1].endswith("STO")  # held until the finish, then released


def test_stop_at_first_token(tokenizer) -> None:
    prompt, output = encode(tokenizer, "Say"), encode(tokenizer, "Hello world")
    in_context = tokenizer.decode(prompt + output[:1])[len(tokenizer.decode(prompt)) :]  # "Hell" or " Hello"
    stop = in_context.strip()[:2]
    detok = IncrementalDetokenizer(tokenizer, prompt, stop=[stop])
    assert detok.push(output[0]) == in_context[: in_context.index(stop)]
    assert detok.stopped and detok.push(output[1]) == "" and detok.flush() == ""


def test_incomplete_character_at_finish_is_dropped() -> None:
    tokenizer = TOKENIZERS["sentencepiece"]
    ids = encode(tokenizer, "ok 🙂")
    assert tokenizer.decode(ids[:-1]).endswith("\ufffd")  # one byte token short of the emoji
    _, streamed, _ = stream(tokenizer, [], ids[:-1], stop=[])
    assert streamed == "ok "


def test_special_tokens_skipped() -> None:
    tokenizer = TOKENIZERS["byte_level"]
    ids = encode(tokenizer, "Hello") + [tokenizer.eos_token_id] + encode(tokenizer, " world")
    assert stream(tokenizer, [], ids, stop=[])[1] == "Hello world"


def test_long_generation_keeps_a_short_window() -> None:
    tokenizer = TOKENIZERS["byte_level"]
    ids = encode(tokenizer, " ".join(TEXTS) * 20)
    detok = IncrementalDetokenizer(tokenizer, [], stop=[])
    streamed = "".join(detok.push(i) for i in ids) + detok.flush()
    assert streamed == tokenizer.decode(ids)
    assert len(detok._ids) < 100


def in_context(tokenizer, prompt: list[int], output: list[int]) -> str:
    return tokenizer.decode(prompt + output)[len(tokenizer.decode(prompt)) :]


@pytest.mark.slow
def test_smollm2_tokenizer_streaming(pulled_models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pulled_models["smollm2-135m-instruct"])
    prompt = encode(tokenizer, "Translate:")
    for text in TEXTS:
        output = encode(tokenizer, text)
        pieces, streamed, _ = stream(tokenizer, prompt, output, stop=[])
        assert streamed == in_context(tokenizer, prompt, output)
        assert all("\ufffd" not in piece for piece in pieces)
    output = encode(tokenizer, " " + TEXTS[0])
    _, streamed, stopped = stream(tokenizer, prompt, output, stop=["요!"])
    full = in_context(tokenizer, prompt, output)
    assert stopped and streamed == full[: full.index("요!")]


class PieceTokenizer:
    """Token i decodes to PIECES[i]: lets a test choose how text is cut into tokens."""

    PIECES = ["xyz", "abcd", "ef", " tail", *"xyzabcdef"]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.PIECES[i] for i in token_ids)


@pytest.mark.parametrize("stops", [["abcd", "bc"], ["bc", "abcd"], ["xyzabcdef", "cd"], ["cd", "d"]])
def test_overlapping_stops_cut_as_a_character_stream_would(stops: list[str]) -> None:
    """The stop that ends first wins, however the text is cut into tokens: cutting at the earliest start
    gave "" for "abcd" as one token and "a" as four (stops "abcd" and "bc")."""
    pieces = PieceTokenizer.PIECES
    text = "xyzabcdef tail"
    as_words = [0, 1, 2, 3]
    as_chars = [pieces.index(c, 4) for c in "xyzabcdef"] + [3]

    def cut(ids: list[int]) -> str:
        detok = IncrementalDetokenizer(PieceTokenizer(), [], stop=stops)
        out = "".join(detok.push(i) for i in ids)
        return out + detok.flush()

    ends = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    assert cut(as_words) == cut(as_chars) == text[:min(ends)[1]]
