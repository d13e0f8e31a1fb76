"""Read a llama-family GGUF file into a Hugging Face config dict and float32 tensors with HF names.

The `gguf` package only parses the container; dequantization is ours (vectorized numpy over whole
tensors), so we control exactly which formats we accept and fail with the tensor's name otherwise.
llama.cpp's converter permutes the rows of q_proj/k_proj (interleaved RoPE); we undo it so the
weights match the HF layout (rotate-half RoPE).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField
from tqdm import tqdm

QT = GGMLQuantizationType
BLOCK_ELEMENTS = 32  # elements per block of Q4_0, Q4_1 and Q8_0


class GGUFError(ValueError):
    """The GGUF file uses an architecture, tensor or type that we do not support."""


# --- dequantization: each function maps (num_blocks, block_bytes) uint8 -> (num_blocks, 32) float32


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """A float16 scale stored at byte `start` of each block, as a (num_blocks, 1) float32 column."""
    return blocks[:, start : start + 2].view(np.float16).astype(np.float32)


def _dequant_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0: f16 scale d, 32 int8 quants: x = d * q."""
    return _f16(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles are elements 0..15 of a block, high nibbles elements 16..31 (ggml layout)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


def _dequant_q4_0(blocks: np.ndarray) -> np.ndarray:
    """Q4_0: f16 scale d, 16 bytes of 4-bit quants: x = d * (q - 8)."""
    return _f16(blocks, 0) * (_nibbles(blocks[:, 2:]) - 8.0)


def _dequant_q4_1(blocks: np.ndarray) -> np.ndarray:
    """Q4_1: f16 scale d, f16 minimum m, 16 bytes of 4-bit quants: x = d * q + m."""
    return _f16(blocks, 0) * _nibbles(blocks[:, 4:]) + _f16(blocks, 2)


BLOCK_DEQUANT: dict[QT, tuple[int, Callable[[np.ndarray], np.ndarray]]] = {
    QT.Q4_0: (2 + 16, _dequant_q4_0),
    QT.Q4_1: (2 + 2 + 16, _dequant_q4_1),
    QT.Q8_0: (2 + 32, _dequant_q8_0),
}
SUPPORTED_TYPES = (QT.F32, QT.F16, QT.BF16, *BLOCK_DEQUANT)


def dequantize(raw: np.ndarray, qtype: QT, shape: tuple[int, ...], name: str = "?") -> np.ndarray:
    """Turn a tensor's raw bytes into a float32 array of `shape` (numpy order, i.e. reversed ne)."""
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    num_elements = int(np.prod(shape))
    if qtype == QT.F32:
        out = data.view(np.float32)
    elif qtype == QT.F16:
        out = data.view(np.float16).astype(np.float32)
    elif qtype == QT.BF16:
        out = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif qtype in BLOCK_DEQUANT:
        block_bytes, fn = BLOCK_DEQUANT[qtype]
        if num_elements % BLOCK_ELEMENTS or data.size != num_elements // BLOCK_ELEMENTS * block_bytes:
            raise GGUFError(
                f"tensor {name}: {data.size} bytes do not hold {num_elements} {qtype.name} values"
            )
        out = fn(data.reshape(-1, block_bytes)).reshape(-1)
    else:
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise GGUFError(f"tensor {name}: GGML type {qtype.name} is not supported (supported: {supported})")
    if out.size != num_elements:
        raise GGUFError(f"tensor {name}: {out.size} values, expected {num_elements} for shape {shape}")
    return out.reshape(shape)


# --- names and layout

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# rope_freqs holds llama3-style RoPE factors that HF recomputes from config.rope_scaling.
SKIPPED_NAMES = {"rope_freqs.weight"}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_tensor_name(name: str) -> str | None:
    """The HF parameter name of a GGUF tensor, None for tensors HF derives itself."""
    if name in SKIPPED_NAMES:
        return None
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    match = _LAYER_RE.match(name)
    if match and match.group(2) in LAYER_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{LAYER_NAMES[part]}.{kind}"
    raise GGUFError(f"tensor {name}: no Hugging Face name known for it (llama architecture)")


def reverse_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: per head, rows (dim/2, 2) -> (2, dim/2)."""
    head_dim_half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, head_dim_half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# --- metadata


def field_value(field: ReaderField) -> Any:
    """A GGUF metadata value as plain Python (str, int, float, bool or a list of them)."""
    types = field.types
    if not types:
        return None

    def one(part: np.ndarray, vtype: GGUFValueType) -> Any:
        return bytes(part).decode("utf-8") if vtype == GGUFValueType.STRING else part.tolist()[0]

    if types[0] == GGUFValueType.ARRAY:
        return [one(field.parts[i], types[-1]) for i in field.data]
    return one(field.parts[field.data[0]], types[0])


def gguf_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Every metadata key of the file (token lists included: they are needed for the tokenizer)."""
    return {key: field_value(field) for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def gguf_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """LlamaConfig keyword arguments from the metadata of a llama-architecture GGUF."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFError(f"GGUF architecture {arch!r} is not supported (only 'llama')")

    def need(key: str) -> Any:
        if f"llama.{key}" not in meta:
            raise GGUFError(f"GGUF metadata llama.{key} is missing")
        return meta[f"llama.{key}"]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    rope_dim = meta.get("llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != hidden // heads:
        config["head_dim"] = int(rope_dim)
    scaling = meta.get("llama.rope.scaling.type")
    if scaling and scaling != "none":
        config["rope_scaling"] = {"rope_type": scaling, "factor": float(meta["llama.rope.scaling.factor"])}
        original = meta.get("llama.rope.scaling.original_context_length")
        if original:
            config["rope_scaling"]["original_max_position_embeddings"] = int(original)
    for key in ("bos", "eos", "padding"):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            config["pad_token_id" if key == "padding" else f"{key}_token_id"] = int(token_id)
    return config


class GGUFWeights(Mapping[str, torch.Tensor]):
    """The tensors of a GGUF by HF name, dequantized one at a time on access (float32, un-permuted).

    The file stays memory-mapped and read-only (an Ollama blob is used in place); the model quantizes
    or casts each tensor as it takes it, so the whole checkpoint is never inflated to float32 at once.
    """

    def __init__(self, reader: GGUFReader, config: dict[str, Any]) -> None:
        self._heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
        self._infos = {}
        for info in reader.tensors:
            hf_name = hf_tensor_name(info.name)
            if hf_name is not None:
                self._infos[hf_name] = info

    def __getitem__(self, name: str) -> torch.Tensor:
        info = self._infos[name]
        shape = tuple(int(n) for n in reversed(info.shape.tolist()))
        weight = dequantize(info.data, QT(info.tensor_type), shape, name=info.name)
        part = info.name.split(".")[2] if info.name.startswith("blk.") else ""
        if part in self._heads:  # llama.cpp permutes q/k weights and biases alike
            weight = reverse_permute(weight, self._heads[part])
        return torch.from_numpy(np.array(weight, dtype=np.float32))  # copy: off the mmap

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    def check(self, name: str) -> None:
        """Raise GGUFError naming the tensor and type if ``name``'s GGML type cannot be read."""
        info = self._infos[name]
        if QT(info.tensor_type) not in SUPPORTED_TYPES:
            supported = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise GGUFError(f"tensor {info.name}: GGML type {QT(info.tensor_type).name} is not supported "
                            f"(supported: {supported})")


def gguf_tensors(
    reader: GGUFReader, config: dict[str, Any], progress: bool = False
) -> dict[str, torch.Tensor]:
    """Dequantize every tensor of `reader` to float32, renamed and un-permuted into the HF layout."""
    weights = GGUFWeights(reader, config)
    return {name: weights[name] for name in tqdm(weights, desc="dequantizing", unit="tensor", disable=not progress)}


def read_gguf(path: Path, progress: bool = False) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Parse `path` and dequantize every tensor: (LlamaConfig kwargs, float32 tensors by HF name)."""
    reader = GGUFReader(path)
    config = gguf_config(gguf_metadata(reader), {t.name for t in reader.tensors})
    return config, gguf_tensors(reader, config, progress)


def open_gguf(path: Path) -> tuple[dict[str, Any], dict[str, Any], GGUFWeights]:
    """(metadata, LlamaConfig kwargs, lazy weights) of a GGUF, reading no tensor yet."""
    reader = GGUFReader(path)
    meta = gguf_metadata(reader)
    config = gguf_config(meta, {t.name for t in reader.tensors})
    return meta, config, GGUFWeights(reader, config)
