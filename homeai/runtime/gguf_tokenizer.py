"""Build a Hugging Face fast tokenizer from the vocabulary stored in GGUF metadata.

transformers' own GGUF tokenizer conversion treats byte-level BPE llama models (SmolLM2) as
sentencepiece ones: it prepends BOS to every prompt, reports BOS as EOS and drops the digit
splitting. We rebuild the tokenizer from the same metadata the way llama.cpp reads it.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from homeai.runtime.gguf_loader import GGUFError

TOKEN_TYPE_CONTROL = 3  # llama.cpp token types: 1 normal, 3 control (special), 4 user-defined
TOKEN_TYPE_USER = 4
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer matching llama.cpp's `tokenizer.ggml.pre` regexes."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("gpt2", "default"):
        return byte_level
    if pre == "smollm":  # digits one by one, then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("llama-bpe", "llama3"):
        split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    raise GGUFError(f"GGUF tokenizer pre-type {pre!r} is not supported (gpt2, smollm, llama-bpe)")


def _token(meta: dict[str, Any], tokens: list[str], key: str) -> str | None:
    token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
    if token_id is None:
        return None
    if not 0 <= int(token_id) < len(tokens):
        raise GGUFError(f"GGUF tokenizer.ggml.{key}_token_id {token_id} is not a token (the vocabulary has "
                        f"{len(tokens)})")
    return tokens[int(token_id)]


def gguf_tokenizer(meta: dict[str, Any], model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with the GGUF's special tokens and chat template."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    for key in ("tokens", "merges"):
        if not meta.get(f"tokenizer.ggml.{key}"):
            raise GGUFError(f"GGUF metadata tokenizer.ggml.{key} is missing: a byte-level BPE tokenizer needs it")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "gpt2"))
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    kinds = list(zip(tokens, types, strict=True))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in kinds if k == TOKEN_TYPE_CONTROL]
    )
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in kinds if k == TOKEN_TYPE_USER])

    bos, eos = _token(meta, tokens, "bos"), _token(meta, tokens, "eos")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        bos_id = int(meta["tokenizer.ggml.bos_token_id"])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token=_token(meta, tokens, "unknown"),
        pad_token=_token(meta, tokens, "padding"),
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=model_max_length or int(meta.get("llama.context_length", 2048)),
        clean_up_tokenization_spaces=False,
    )
