"""GGUF dequantization through gguf.quants (shapes, the block layouts we rely on, refusals), names,
un-permutation, config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, quants

from homeai.runtime.gguf_loader import (
    GGUFError,
    dequantize,
    gguf_config,
    hf_tensor_name,
    read_gguf,
    reverse_permute,
)

QT = GGMLQuantizationType
TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q8_0]


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj/k_proj rows (copied for the test)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 96), (32,)])
def test_dequantize_matches_gguf_reference(qtype: QT, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(int(qtype) * 100 + len(shape))
    values = (rng.standard_normal(shape) * rng.uniform(0.01, 10)).astype(np.float32)
    raw = quants.quantize(values, qtype)
    expected = quants.dequantize(raw, qtype).reshape(shape)
    ours = dequantize(raw, qtype, shape, name="t")
    assert ours.dtype == np.float32 and ours.shape == shape
    np.testing.assert_array_equal(ours, expected)


def test_q4_0_hand_built_block() -> None:
    # d = 0.5; byte j holds element j in its low nibble and element j + 16 in its high nibble.
    qs = np.array([j | ((15 - j) << 4) for j in range(16)], dtype=np.uint8)
    block = np.concatenate([np.array([0.5], dtype=np.float16).view(np.uint8), qs])
    expected = np.array([0.5 * (j - 8) for j in range(16)] + [0.5 * (7 - j) for j in range(16)], np.float32)
    np.testing.assert_array_equal(dequantize(block, QT.Q4_0, (32,)), expected)
    np.testing.assert_array_equal(quants.dequantize(block, QT.Q4_0).reshape(-1), expected)


def test_q4_1_and_q8_0_hand_built_blocks() -> None:
    d, m = np.array([0.25, -1.0], dtype=np.float16).view(np.uint8).reshape(2, 2)
    qs = np.full(16, 0x3A, dtype=np.uint8)  # low nibble 10, high nibble 3
    q41 = dequantize(np.concatenate([d, m, qs]), QT.Q4_1, (32,))
    np.testing.assert_array_equal(q41, [0.25 * 10 - 1.0] * 16 + [0.25 * 3 - 1.0] * 16)
    q8 = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    np.testing.assert_array_equal(dequantize(np.concatenate([d, q8]), QT.Q8_0, (32,)), np.arange(-16, 16) / 4)


def test_unsupported_type_names_tensor_and_type() -> None:
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_down\.weight.*Q6_K"):
        dequantize(np.zeros(210, np.uint8), QT.Q6_K, (256,), name="blk.0.ffn_down.weight")


def test_wrong_byte_count_is_an_error() -> None:
    with pytest.raises(GGUFError, match="do not hold"):
        dequantize(np.zeros(19, np.uint8), QT.Q4_1, (32,), name="x")


@pytest.mark.parametrize(
    ("gguf_name", "hf_name"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.12.attn_k.bias", "model.layers.12.self_attn.k_proj.bias"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"),
        ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
        ("blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"),
        ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
        ("rope_freqs.weight", None),
    ],
)
def test_hf_tensor_name(gguf_name: str, hf_name: str | None) -> None:
    assert hf_tensor_name(gguf_name) == hf_name


def test_unknown_tensor_name_is_an_error() -> None:
    with pytest.raises(GGUFError, match="blk.0.ffn_gate_exps.weight"):
        hf_tensor_name("blk.0.ffn_gate_exps.weight")


@pytest.mark.parametrize(("num_heads", "head_dim", "cols"), [(9, 64, 576), (3, 64, 576), (4, 8, 0)])
def test_reverse_permute_undoes_llama_cpp(num_heads: int, head_dim: int, cols: int) -> None:
    shape = (num_heads * head_dim, cols) if cols else (num_heads * head_dim,)  # cols=0: a bias
    weight = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    permuted = llama_cpp_permute(weight, num_heads)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(reverse_permute(permuted, num_heads), weight)


def _meta(**extra: object) -> dict[str, object]:
    meta: dict[str, object] = {
        "general.architecture": "llama",
        "llama.embedding_length": 64,
        "llama.feed_forward_length": 128,
        "llama.block_count": 2,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
        "llama.context_length": 256,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(96)],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    return {**meta, **extra}


def test_gguf_config_fields() -> None:
    config = gguf_config(_meta(), {"token_embd.weight"})
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (64, 128, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["vocab_size"] == 96 and config["max_position_embeddings"] == 256
    assert config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert "rope_scaling" not in config and "head_dim" not in config
    assert gguf_config(_meta(), {"output.weight"})["tie_word_embeddings"] is False


def test_gguf_config_rope_scaling() -> None:
    meta = _meta(
        **{
            "llama.rope.scaling.type": "linear",
            "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 64,
        }
    )
    scaling = gguf_config(meta, set())["rope_scaling"]
    assert scaling == {"rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 64}


def test_gguf_config_rejects_other_architectures_and_missing_keys() -> None:
    with pytest.raises(GGUFError, match="qwen2"):
        gguf_config(_meta(**{"general.architecture": "qwen2"}), set())
    meta = _meta()
    del meta["llama.block_count"]
    with pytest.raises(GGUFError, match="llama.block_count"):
        gguf_config(meta, set())


def write_tiny_gguf(path: Path, meta: dict[str, object], hf: dict[str, tuple[np.ndarray, QT]]) -> None:
    """A GGUF as llama.cpp writes one: q/k rows permuted, each tensor in its type."""
    writer = GGUFWriter(path, "llama")
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, int(value))  # type: ignore[call-overload]
    heads = {"attn_q": 4, "attn_k": 2}
    for name, (weight, qtype) in hf.items():
        part = name.split(".")[2] if name.startswith("blk") else ""
        stored = llama_cpp_permute(weight, heads[part]) if part in heads else weight
        raw = quants.quantize(stored.astype(np.float32), qtype)
        writer.add_tensor(name, raw, raw_dtype=None if qtype in (QT.F32, QT.F16) else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_llama3_rope_factors_are_read_and_applied(tmp_path: Path) -> None:
    """llama.cpp writes Llama 3.1/3.2's RoPE scaling only as the rope_freqs tensor (no scaling key): it was
    skipped, and such a model served with the base frequencies (wrong attention, worse with context)."""
    from homeai.runtime.llama_config import LlamaConfig, rope_inv_freq

    rng = np.random.default_rng(2)
    factors = np.linspace(1.0, 32.0, 8).astype(np.float32)  # head_dim 16: 8 frequencies
    hf = {"token_embd.weight": (rng.standard_normal((96, 64)), QT.F32),
          "rope_freqs.weight": (factors, QT.F32)}
    write_tiny_gguf(tmp_path / "llama3.gguf", _meta(), hf)
    config, tensors = read_gguf(tmp_path / "llama3.gguf")
    assert config["rope_freq_factors"] == pytest.approx(factors.tolist())
    assert "rope_freqs.weight" not in tensors
    cfg = LlamaConfig.from_hf(config)
    base = LlamaConfig.from_hf({**config, "rope_freq_factors": None})
    np.testing.assert_allclose(rope_inv_freq(cfg).numpy(), (rope_inv_freq(base) / factors).numpy(), rtol=1e-6)
    write_tiny_gguf(tmp_path / "short.gguf", _meta(), {**hf, "rope_freqs.weight": (factors[:5], QT.F32)})
    with pytest.raises(GGUFError, match="5 factors"):
        read_gguf(tmp_path / "short.gguf")


def test_a_rope_our_decoder_cannot_compute_is_refused_when_read(tmp_path: Path) -> None:
    """YaRN was accepted at pull and failed at the first load."""
    meta = {**_meta(), "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    write_tiny_gguf(tmp_path / "yarn.gguf", meta, {"token_embd.weight": (np.ones((96, 64)), QT.F32)})
    with pytest.raises(GGUFError, match="unsupported rope_scaling type 'yarn'"):
        read_gguf(tmp_path / "yarn.gguf")


def test_read_gguf_end_to_end(tmp_path: Path) -> None:
    """A tiny llama written with GGUFWriter: names, shapes (ne reversed), types and un-permuted q/k."""
    meta = _meta()
    rng = np.random.default_rng(1)
    hf = {
        "token_embd.weight": (rng.standard_normal((96, 64)), QT.Q8_0),
        "output_norm.weight": (rng.standard_normal(64), QT.F32),
        "blk.0.attn_q.weight": (rng.standard_normal((64, 64)), QT.Q4_0),
        "blk.0.attn_k.weight": (rng.standard_normal((32, 64)), QT.Q4_1),
        "blk.0.ffn_down.weight": (rng.standard_normal((64, 128)), QT.F16),
    }
    write_tiny_gguf(tmp_path / "tiny.gguf", meta, hf)

    config, tensors = read_gguf(tmp_path / "tiny.gguf")
    assert config["num_attention_heads"] == 4 and config["tie_word_embeddings"] is True
    for name, (weight, qtype) in hf.items():
        ours = tensors[hf_tensor_name(name)]  # type: ignore[index]
        expected = quants.dequantize(quants.quantize(weight.astype(np.float32), qtype), qtype)
        assert tuple(ours.shape) == weight.shape, name
        np.testing.assert_array_equal(ours.numpy(), expected.reshape(weight.shape), err_msg=name)


def _tokenizer_meta(**extra: object) -> dict[str, object]:
    from tokenizers.pre_tokenizers import ByteLevel

    tokens = ["<|end|>", "<|start|>", *sorted(ByteLevel.alphabet()), "Ġa"]
    meta: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["Ġ a"],
        "tokenizer.ggml.token_type": [3, 3] + [1] * (len(tokens) - 2),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.chat_template": "{{ messages[0]['content'] }}",
    }
    return {**meta, **extra}


def test_gguf_tokenizer_byte_level_bpe() -> None:
    from homeai.runtime.gguf_tokenizer import gguf_tokenizer

    tok = gguf_tokenizer(_tokenizer_meta(), model_max_length=128)
    ids = tok(" a12<|start|>").input_ids
    assert tok.convert_ids_to_tokens(ids) == ["Ġa", "1", "2", "<|start|>"]  # merges, digits split, specials
    assert (tok.eos_token, tok.bos_token, tok.model_max_length) == ("<|end|>", "<|start|>", 128)
    assert tok.decode(ids, skip_special_tokens=True) == " a12"
    with_bos = gguf_tokenizer(_tokenizer_meta(**{"tokenizer.ggml.add_bos_token": True}))
    assert with_bos(" a").input_ids[0] == 1


def test_gguf_tokenizer_rejects_sentencepiece() -> None:
    from homeai.runtime.gguf_tokenizer import gguf_tokenizer

    with pytest.raises(GGUFError, match="'llama'"):
        gguf_tokenizer(_tokenizer_meta(**{"tokenizer.ggml.model": "llama"}))


def test_pulling_a_gguf_whose_tokenizer_is_incomplete_names_it_and_leaves_no_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF without merges (or with a special token id past its vocabulary) gave a KeyError (IndexError)
    traceback, and its new entry stayed in the repository with nothing pulled."""
    from homeai.cli.repository_cmds import main as cli_main

    monkeypatch.setenv("HOMEAI_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(tmp_path / "cache"))
    for name, meta, says in (
            ("nomerges", {k: v for k, v in _tokenizer_meta().items() if k != "tokenizer.ggml.merges"},
             "tokenizer.ggml.merges is missing"),
            ("badbos", _tokenizer_meta(**{"tokenizer.ggml.bos_token_id": 999_999}),
             "bos_token_id 999999 is not a token")):
        path = tmp_path / f"{name}.gguf"
        write_tiny_gguf(path, {**_meta(), **meta}, {"token_embd.weight": (np.ones((96, 64)), QT.F32)})
        assert cli_main(["pull", str(path)]) == 1
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
        assert not list((tmp_path / "models").glob("*.yaml"))
