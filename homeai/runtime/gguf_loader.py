"""Read a llama-family GGUF file into a Hugging Face config dict and float32 tensors with HF names.

The `gguf` package parses the container and dequantizes (``gguf.quants``); we accept the float types
and the 32-element block types Q4_0, Q4_1 and Q8_0, and fail with the tensor's name otherwise.
llama.cpp's converter permutes the rows of q_proj/k_proj (interleaved RoPE); we undo it so the
weights match the HF layout (rotate-half RoPE).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, quants
from gguf.gguf_reader import ReaderField
from tqdm import tqdm

QT = GGMLQuantizationType
# gguf.quants reads more (K- and I-quants): accepting them is a decision about what such a model would
# serve as (homeai.runtime.weights_format), not about reading it.
SUPPORTED_TYPES = (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q8_0)


class GGUFError(ValueError):
    """The GGUF file uses an architecture, tensor or type that we do not support."""


def unsupported_type(name: str, qtype: QT) -> GGUFError:
    supported = ", ".join(t.name for t in SUPPORTED_TYPES)
    return GGUFError(f"tensor {name}: GGML type {qtype.name} is not supported (supported: {supported})")


def dequantize(raw: np.ndarray, qtype: QT, shape: tuple[int, ...], name: str = "?") -> np.ndarray:
    """Turn a tensor's raw bytes into a float32 array of `shape` (numpy order, i.e. reversed ne)."""
    if qtype not in SUPPORTED_TYPES:
        raise unsupported_type(name, qtype)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    num_elements = int(np.prod(shape))
    block_elements, block_bytes = GGML_QUANT_SIZES[qtype]
    if num_elements % block_elements or data.size != num_elements // block_elements * block_bytes:
        raise GGUFError(f"tensor {name}: {data.size} bytes do not hold {num_elements} {qtype.name} values")
    return quants.dequantize(data, qtype).astype(np.float32, copy=False).reshape(shape)


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
# rope_freqs holds Llama 3's RoPE frequency factors: not a weight, read into the config (rope_freq_factors).
ROPE_FACTORS = "rope_freqs.weight"
SKIPPED_NAMES = {ROPE_FACTORS}
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
            raise unsupported_type(info.name, QT(info.tensor_type))


def gguf_tensors(
    reader: GGUFReader, config: dict[str, Any], progress: bool = False
) -> dict[str, torch.Tensor]:
    """Dequantize every tensor of `reader` to float32, renamed and un-permuted into the HF layout."""
    weights = GGUFWeights(reader, config)
    return {name: weights[name] for name in tqdm(weights, desc="dequantizing", unit="tensor", disable=not progress)}


def reader_config(reader: GGUFReader, meta: dict[str, Any]) -> dict[str, Any]:
    """``gguf_config`` plus what the tensors say: Llama 3's RoPE frequency factors. llama.cpp writes Llama
    3.1/3.2's RoPE scaling only as the ``rope_freqs`` tensor (no scaling key): it was skipped, and such a model
    served with the base frequencies (15 of 32 off, by up to 32x: wrong attention, worse with context).
    A RoPE our decoder cannot compute (YaRN) is refused here, at pull, not at the first load."""
    from homeai.runtime.llama_config import LlamaConfig, rope_inv_freq

    config = gguf_config(meta, {t.name for t in reader.tensors})
    factors = next((t for t in reader.tensors if t.name == ROPE_FACTORS), None)
    if factors is not None:
        if factors.tensor_type != GGMLQuantizationType.F32:
            raise GGUFError(f"{ROPE_FACTORS} is {factors.tensor_type.name}, not F32")
        values = [float(v) for v in np.asarray(factors.data, dtype=np.float32).reshape(-1)]
        half = (config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]) // 2
        if len(values) != half:
            raise GGUFError(f"{ROPE_FACTORS} holds {len(values)} factors; the heads' RoPE has {half} frequencies")
        config["rope_freq_factors"] = values
    try:
        rope_inv_freq(LlamaConfig.from_hf(config))
    except ValueError as exc:
        raise GGUFError(f"RoPE: {exc}") from exc
    return config


def read_gguf(path: Path, progress: bool = False) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Parse `path` and dequantize every tensor: (LlamaConfig kwargs, float32 tensors by HF name)."""
    reader = GGUFReader(path)
    config = reader_config(reader, gguf_metadata(reader))
    return config, gguf_tensors(reader, config, progress)


def open_gguf(path: Path) -> tuple[dict[str, Any], dict[str, Any], GGUFWeights]:
    """(metadata, LlamaConfig kwargs, lazy weights) of a GGUF, reading no tensor yet."""
    reader = GGUFReader(path)
    meta = gguf_metadata(reader)
    config = reader_config(reader, meta)
    return meta, config, GGUFWeights(reader, config)
