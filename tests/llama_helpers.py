"""Random Llama weights of any shape for tests that run the real runtime without the real model.

pytest puts ``tests/`` on sys.path, so tests import this as ``llama_helpers``.
"""

from __future__ import annotations

import torch

from homeai.runtime.llama_config import LlamaConfig


def random_llama_weights(cfg: LlamaConfig, seed: int = 0, scale: float = 0.2,
                         embed_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A checkpoint in Hugging Face's names: normal weights times ``scale`` (the embedding times
    ``embed_scale`` more), norms of ones."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    d, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    w = {"model.embed_tokens.weight": rand(cfg.vocab_size, cfg.hidden_size) * embed_scale,
         "model.norm.weight": torch.ones(cfg.hidden_size)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": torch.ones(cfg.hidden_size),
              p + "post_attention_layernorm.weight": torch.ones(cfg.hidden_size),
              p + "self_attn.q_proj.weight": rand(d, cfg.hidden_size),
              p + "self_attn.k_proj.weight": rand(kv, cfg.hidden_size),
              p + "self_attn.v_proj.weight": rand(kv, cfg.hidden_size),
              p + "self_attn.o_proj.weight": rand(cfg.hidden_size, d),
              p + "mlp.gate_proj.weight": rand(cfg.intermediate_size, cfg.hidden_size),
              p + "mlp.up_proj.weight": rand(cfg.intermediate_size, cfg.hidden_size),
              p + "mlp.down_proj.weight": rand(cfg.hidden_size, cfg.intermediate_size)}
    return w
