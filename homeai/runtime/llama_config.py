"""The Llama-family hyperparameters our decoder needs, read from a Hugging Face config.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rope_freq_factors: list[float] | None = None  # Llama 3's per-frequency divisors as a GGUF holds them
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if not any(a in _SUPPORTED for a in archs):
            raise ValueError(f"unsupported architecture {archs}; supported: {sorted(_SUPPORTED)}")
        quant = cfg.get("quantization_config")
        if quant:  # GPTQ, AWQ, bitsandbytes...: packed weights our loader does not read
            method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
            raise ValueError(f"quantized checkpoint ({method!r}) is not supported: use float or bf16 weights "
                             "(or a GGUF) and `quantization: int8` in the model entry")
        num_heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            rope_freq_factors=cfg.get("rope_freq_factors"),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=[] if eos is None else (list(eos) if isinstance(eos, list) else [eos]),
        )

    @classmethod
    def from_folder(cls, folder: Path) -> LlamaConfig:
        return cls.from_hf(json.loads((folder / "config.json").read_text()))


# Qwen2 adds biases to q/k/v; the loader fills them when present, so the same decoder serves both.
_SUPPORTED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse RoPE frequencies, with Llama-3 scaling when the config asks for it."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind == "llama3":
        factor = scaling["factor"]
        low_freq_factor = scaling.get("low_freq_factor", 1.0)
        high_freq_factor = scaling.get("high_freq_factor", 4.0)
        old_len = scaling.get("original_max_position_embeddings", 8192)
        low_freq_wavelen = old_len / low_freq_factor
        high_freq_wavelen = old_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
    if cfg.rope_freq_factors is not None:  # as llama.cpp applies a GGUF's rope_freqs: each frequency divided
        factors = torch.tensor(cfg.rope_freq_factors, dtype=torch.float64)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"{factors.numel()} RoPE frequency factors for {inv_freq.numel()} frequencies")
        inv_freq = inv_freq / factors
    return inv_freq.to(torch.float32)
