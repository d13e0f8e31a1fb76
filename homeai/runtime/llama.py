"""A Llama-family decoder that runs one forward pass over a flat batch of many sequences' tokens.

Prefill chunks and decode tokens of different sequences share each step: every weight matrix is read
once per step for all of them (the reason batching pays on a GPU, and on a CPU past one stream). Keys
and values live in a paged cache (``KVCache``); ``AttentionMetadata`` tells each layer where to write
the new ones and which cache slots each sequence attends to. q/k/v and gate/up are fused so a layer is
a handful of large matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from homeai.runtime.kv_cache import KVCache
from homeai.runtime.llama_config import LlamaConfig, rope_inv_freq


@dataclass(slots=True)
class PrefillChunk:
    """A run of ``num_tokens`` new tokens of one sequence at flat offset ``token_start``."""

    token_start: int
    num_tokens: int
    context_slots: torch.Tensor | None  # [ctx] cache slots incl. the new tokens; None: no earlier context
    mask: torch.Tensor | None  # [n, ctx] bool, True where attention is allowed


@dataclass(slots=True)
class AttentionMetadata:
    """Where each step's tokens go in the cache and what they attend to; built once, shared by layers."""

    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    decode_token_idx: torch.Tensor | None = None  # [Bd] flat index of each single-token (decode) row
    decode_slots: torch.Tensor | None = None  # [Bd, L] context slots, padded
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, L] bool
    all_decode: bool = False  # every token is a decode, in order: no scatter needed
    prefills: list[PrefillChunk] = field(default_factory=list)


class LlamaModel(torch.nn.Module):
    """Llama / Mistral / Qwen2-style decoder: RMSNorm, RoPE (incl. Llama-3 scaling), GQA, SwiGLU."""

    def __init__(self, cfg: LlamaConfig, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.device = device
        self.dtype = dtype

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype).contiguous()

        self.embed = w("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings or "lm_head.weight" not in weights \
            else w("lm_head.weight")
        self.final_norm = w("model.norm.weight")
        self.layers: list[dict[str, torch.Tensor | None]] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            bias = [weights.get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
            if all(b is not None for b in bias):
                bias[0] = _interleave(bias[0], cfg.num_heads)
                bias[1] = _interleave(bias[1], cfg.num_kv_heads)
            self.layers.append({
                "attn_norm": w(p + "input_layernorm.weight"),
                "qkv": torch.cat([_interleave(w(p + "self_attn.q_proj.weight"), cfg.num_heads),
                                  _interleave(w(p + "self_attn.k_proj.weight"), cfg.num_kv_heads),
                                  w(p + "self_attn.v_proj.weight")]),
                "qkv_bias": torch.cat(bias).to(device, dtype) if all(b is not None for b in bias) else None,
                "o": w(p + "self_attn.o_proj.weight"),
                "mlp_norm": w(p + "post_attention_layernorm.weight"),
                "gate_up": torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
                "down": w(p + "mlp.down_proj.weight"),
            })
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, rope_inv_freq(cfg))  # [max_pos, d/2]
        # q/k rows are stored interleaved (see _interleave), so RoPE is one complex multiply.
        self.rope_table = torch.polar(torch.ones_like(freqs), freqs).to(device)  # complex64

    @classmethod
    def from_folder(cls, folder: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> LlamaModel:
        cfg = LlamaConfig.from_folder(folder)
        weights: dict[str, torch.Tensor] = {}
        for path in sorted(folder.glob("*.safetensors")):
            weights.update(load_file(str(path)))
        if not weights:
            raise FileNotFoundError(f"no *.safetensors in {folder}")
        return cls(cfg, weights, device, dtype)


    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                cache: KVCache, logits_idx: torch.Tensor) -> torch.Tensor:
        """Run the flat batch; return float32 logits for the rows in ``logits_idx`` only."""
        cfg = self.cfg
        num_tokens = input_ids.shape[0]
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size = h * d
        qk_size = (h + kvh) * d
        rope = self.rope_table[positions].unsqueeze(1)  # [T, 1, d/2] complex
        x = F.embedding(input_ids, self.embed)
        for li, layer in enumerate(self.layers):
            hs = F.rms_norm(x, (cfg.hidden_size,), layer["attn_norm"], cfg.rms_norm_eps)
            qkv = F.linear(hs, layer["qkv"], layer["qkv_bias"])
            # RoPE on q and k heads together, in place: they are adjacent in qkv.
            qk = qkv[:, :qk_size]
            rotated = torch.view_as_complex(qk.float().reshape(num_tokens, h + kvh, d // 2, 2)) * rope
            qk.copy_(torch.view_as_real(rotated).view(num_tokens, qk_size))
            q = qkv[:, :q_size].view(num_tokens, h, d)
            kv = qkv[:, q_size:].view(num_tokens, 2, kvh, d)  # the cache's slot layout
            cache.write(li, meta.slot_mapping, kv)
            attn = self._attention(li, q, kv, meta, cache)
            x = x + F.linear(attn.reshape(num_tokens, q_size), layer["o"])
            hs = F.rms_norm(x, (cfg.hidden_size,), layer["mlp_norm"], cfg.rms_norm_eps)
            gate, up = F.linear(hs, layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        x = F.rms_norm(x[logits_idx], (cfg.hidden_size,), self.final_norm, cfg.rms_norm_eps)
        return F.linear(x, self.lm_head).float()

    def _attention(self, li: int, q: torch.Tensor, kv: torch.Tensor, meta: AttentionMetadata,
                   cache: KVCache) -> torch.Tensor:
        cfg = self.cfg
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        group = h // kvh
        if meta.decode_token_idx is not None:
            # Decodes: one query per sequence; the query heads of a KV head form its "query rows",
            # so GQA needs no copy of keys or values.
            bd = meta.decode_token_idx.shape[0]
            qd = (q if meta.all_decode else q[meta.decode_token_idx]).reshape(bd, kvh, group, d)
            ctx = cache.gather(li, meta.decode_slots)  # [Bd, L, 2, kvh, d]
            o = F.scaled_dot_product_attention(qd, ctx[:, :, 0].transpose(1, 2), ctx[:, :, 1].transpose(1, 2),
                                               attn_mask=meta.decode_mask)
            if meta.all_decode:
                return o.reshape(bd, h, d)
            out = torch.empty_like(q)
            out[meta.decode_token_idx] = o.reshape(bd, h, d)
        else:
            out = torch.empty_like(q)
        for chunk in meta.prefills:
            sl = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
            qp = q[sl].transpose(0, 1).unsqueeze(0)  # [1, h, n, d]
            if chunk.context_slots is None:  # a first chunk sees only itself: causal, no gather
                kp, vp = kv[sl, 0], kv[sl, 1]
                o = F.scaled_dot_product_attention(qp, kp.transpose(0, 1).unsqueeze(0),
                                                   vp.transpose(0, 1).unsqueeze(0),
                                                   is_causal=True, enable_gqa=True)
            else:
                ctx = cache.gather(li, chunk.context_slots)  # [L, 2, kvh, d]
                o = F.scaled_dot_product_attention(qp, ctx[:, 0].transpose(0, 1).unsqueeze(0),
                                                   ctx[:, 1].transpose(0, 1).unsqueeze(0),
                                                   attn_mask=chunk.mask, enable_gqa=True)
            out[sl] = o.squeeze(0).transpose(0, 1)
        return out


def _interleave(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder each head's rows from the half-split RoPE layout (HF: pairs (i, i + d/2)) to the
    interleaved one (pairs (2i, 2i + 1)). q and k get the same order, so q.k is unchanged, and RoPE
    becomes a complex multiply on adjacent pairs."""
    rows = w.shape[0]
    d = rows // num_heads
    rest = w.shape[1:]
    return w.reshape(num_heads, 2, d // 2, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()
