"""A Llama-family decoder that runs one forward pass over a flat batch of many sequences' tokens.

Prefill chunks and decode tokens of different sequences share each step: every weight matrix is read
once per step for all of them (the reason batching pays on a GPU, and on a CPU past one stream). Keys
and values live in a paged cache (``KVCache``); ``AttentionMetadata`` tells each layer where to write
the new ones and which cache slots each sequence attends to. q/k/v and gate/up are fused so a layer is
a handful of large matmuls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from homeai.runtime.device import release_free_memory
from homeai.runtime.kernels import LayerGlue
from homeai.runtime.kv_cache import KVCache, kv_cache_dtype
from homeai.runtime.llama_config import LlamaConfig, rope_inv_freq
from homeai.runtime.quant import CPU_HAS_AMX, Linear, make_linear

GGUF_WEIGHTS = "model.gguf"  # in a model folder: a link to a GGUF whose tensors are the weights


@dataclass(slots=True)
class PrefillChunk:
    """A run of ``num_tokens`` new tokens of one sequence at flat offset ``token_start``."""

    token_start: int
    num_tokens: int
    context_slots: torch.Tensor | None  # [ctx] cache slots incl. the new tokens; None: no earlier context
    mask: torch.Tensor | None  # [n, ctx] bool, True where attention is allowed
    # The chunk's first position where it attends through the paged prefill kernel (context_slots: every
    # position's slot up to its last token, no mask: causal by position); None: SDPA as above.
    paged_start: int | None = None


@dataclass(slots=True)
class AttentionMetadata:
    """Where each step's tokens go in the cache and what they attend to; built once, shared by layers."""

    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    decode_token_idx: torch.Tensor | None = None  # [Bd] flat index of each single-token (decode) row
    decode_slots: torch.Tensor | None = None  # [Bd, L] context slots, padded
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, L] bool
    decode_lens: torch.Tensor | None = None  # [Bd] context length of each decode row (incl. its new token)
    all_decode: bool = False  # every token is a decode, in order: no scatter needed
    prefills: list[PrefillChunk] = field(default_factory=list)


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer: two norms and four (fused) linear layers, dense or quantized."""

    attn_norm: torch.Tensor
    qkv: Linear
    o: Linear
    mlp_norm: torch.Tensor
    gate_up: Linear
    down: Linear


class SafetensorsWeights(Mapping[str, torch.Tensor]):
    """Tensors of a folder's ``*.safetensors`` read one at a time on access: the model quantizes or
    moves each as it goes, so a full float32 copy of the checkpoint never sits in memory at once."""

    def __init__(self, paths: list[Path]) -> None:
        self._where: dict[str, Path] = {}
        for path in paths:
            with safe_open(str(path), framework="pt") as f:
                self._where.update({name: path for name in f.keys()})  # noqa: SIM118 - not a dict

    def __getitem__(self, name: str) -> torch.Tensor:
        with safe_open(str(self._where[name]), framework="pt") as f:
            return f.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class LlamaModel(torch.nn.Module):
    """Llama / Mistral / Qwen2-style decoder: RMSNorm, RoPE (incl. Llama-3 scaling), GQA, SwiGLU."""

    def __init__(self, cfg: LlamaConfig, weights: Mapping[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, quantization: str = "none") -> None:
        super().__init__()
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        self.quantization = quantization

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype).contiguous()

        def lin(weight: torch.Tensor, bias: torch.Tensor | None = None, head: bool = False) -> Linear:
            # int4 is for the layers; the embedding / lm_head (the logits' rows) stays int8 then
            fmt = "int8" if head and quantization == "int4" else quantization
            return make_linear(weight, bias, fmt, device, dtype, head=head)

        self.embed = lin(weights["model.embed_tokens.weight"], head=True)
        self.lm_head = self.embed if cfg.tie_word_embeddings or "lm_head.weight" not in weights \
            else lin(weights["lm_head.weight"], head=True)
        self.final_norm = w("model.norm.weight")
        self.layers: list[LayerWeights] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            q_bias, k_bias, v_bias = (weights.get(p + f"self_attn.{n}_proj.bias") for n in "qkv")
            qkv_bias = None
            if q_bias is not None and k_bias is not None and v_bias is not None:
                qkv_bias = torch.cat([_interleave(q_bias, cfg.num_heads), _interleave(k_bias, cfg.num_kv_heads),
                                      v_bias]).to(device, dtype)
            qkv = torch.cat([_interleave(weights[p + "self_attn.q_proj.weight"], cfg.num_heads),
                             _interleave(weights[p + "self_attn.k_proj.weight"], cfg.num_kv_heads),
                             weights[p + "self_attn.v_proj.weight"]])
            gate_up = torch.cat([weights[p + "mlp.gate_proj.weight"], weights[p + "mlp.up_proj.weight"]])
            self.layers.append(LayerWeights(
                attn_norm=w(p + "input_layernorm.weight"),
                qkv=lin(qkv, qkv_bias),
                o=lin(weights[p + "self_attn.o_proj.weight"]),
                mlp_norm=w(p + "post_attention_layernorm.weight"),
                gate_up=lin(gate_up),
                down=lin(weights[p + "mlp.down_proj.weight"]),
            ))
            del qkv, gate_up
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, rope_inv_freq(cfg))  # [max_pos, d/2]
        # q/k rows are stored interleaved (see _interleave), so RoPE is one complex multiply.
        self.rope_table = torch.polar(torch.ones_like(freqs), freqs).to(device)  # complex64
        # Decode rows attend straight from the paged cache where the native kernel serves this model.
        self.paged_attention: Callable[..., torch.Tensor] | None = None
        if device.type == "cpu" and dtype == torch.float32 and cfg.head_dim in (64, 128):
            from homeai.runtime.kernels import decode_attention

            self.paged_attention = decode_attention()
        # ... and prompt chunks, causal, from the same cache.
        self.prefill_attention: Callable[..., torch.Tensor] | None = None
        if self.paged_attention is not None:
            from homeai.runtime.kernels import prefill_attention

            self.prefill_attention = prefill_attention()
        # Eager steps' elementwise work fused where the native kernels serve (float32 on an AVX-512 CPU).
        self.glue: LayerGlue | None = None
        if device.type == "cpu" and dtype == torch.float32 and cfg.head_dim % 16 == 0:
            from homeai.runtime.kernels import layer_glue

            self.glue = layer_glue()
        self._rope_pairs = torch.view_as_real(self.rope_table)  # [max_pos, d/2, 2]: (cos, sin) per pair
        self.kv_dtype = kv_cache_dtype(dtype, quantization, self.paged_attention is not None)
        # Prompt chunks attend in bfloat16 on a CPU with AMX (quantized weights only, whose prompts already
        # round more): SDPA's CPU kernel runs bfloat16 on AMX, 2.6x float32's speed at a 256-token chunk over
        # 1,536 tokens of context (43 % of a long prompt's time in float32). With AVX512-BF16 alone it is
        # slower than float32 (an EPYC: a 46-token prompt 219 against 166 us a layer, 512 tokens 7.7 against 6.8 ms).
        self.prompt_attention_dtype = torch.bfloat16 if device.type == "cpu" and quantization != "none" \
            and CPU_HAS_AMX else dtype
        # The prefill kernel multiplies in bfloat16 pairs for the same models, where the CPU has AVX512-BF16
        # (prefill_attention.cpp); float32 weights keep float32 attention, the exact reference.
        self.prompt_attention_bf16 = quantization != "none"

    @classmethod
    def from_folder(cls, folder: Path, device: torch.device, dtype: torch.dtype = torch.float32,
                    quantization: str = "none") -> LlamaModel:
        """A Hugging Face folder: weights from ``*.safetensors``, else from the ``model.gguf`` a GGUF or
        Ollama pull links there (read in place, dequantized tensor by tensor)."""
        cfg = LlamaConfig.from_folder(folder)
        paths = sorted(folder.glob("*.safetensors"))
        weights: Mapping[str, torch.Tensor]
        if paths:
            weights = SafetensorsWeights(paths)
        elif (folder / GGUF_WEIGHTS).exists():
            from homeai.runtime.gguf_loader import open_gguf

            weights = open_gguf(folder / GGUF_WEIGHTS)[2]
        else:
            raise FileNotFoundError(f"no *.safetensors and no {GGUF_WEIGHTS} in {folder}")
        model = cls(cfg, weights, device, dtype, quantization)
        release_free_memory()
        return model

    def _weights(self) -> tuple[list[Linear], list[torch.Tensor]]:
        """Distinct linear layers (a tied lm_head counts once) and the norm vectors."""
        linears = {id(x): x for x in (self.embed, self.lm_head,
                                      *(x for la in self.layers for x in (la.qkv, la.o, la.gate_up, la.down)))}
        norms = [self.final_norm, *(t for la in self.layers for t in (la.attn_norm, la.mlp_norm))]
        return list(linears.values()), norms

    def weight_bytes(self) -> int:
        """Bytes of distinct weights a decode step reads (the memory-bandwidth bound's numerator)."""
        linears, norms = self._weights()
        return sum(x.nbytes for x in linears) + sum(t.numel() * t.element_size() for t in norms)

    def num_params(self) -> int:
        linears, norms = self._weights()
        return sum(x.num_weights for x in linears) + sum(t.numel() for t in norms)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                cache: KVCache, logits_idx: torch.Tensor) -> torch.Tensor:
        """Run the flat batch; return float32 logits for the rows in ``logits_idx`` only."""
        cfg = self.cfg
        num_tokens = input_ids.shape[0]
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size = h * d
        x = self.embed.embed(input_ids, self.dtype).contiguous()  # a fresh tensor: the residual adds go into it
        delta: torch.Tensor | None = None  # the last sublayer's output, added to x where the next norm runs
        last = len(self.layers) - 1
        # Rows whose last-layer output nobody reads (a prompt's tokens before its last) need only their keys
        # and values there: the last layer's attention output, o and MLP run on the logits rows alone, as
        # llama.cpp's inp_out_ids does (1/30 of a prompt chunk's matmuls for SmolLM2).
        select = logits_idx.numel() < num_tokens
        for li, layer in enumerate(self.layers):
            hs = self._add_norm(x, delta, layer.attn_norm)
            qkv = layer.qkv(hs)
            self._rope(qkv, positions)
            q = qkv[:, :q_size].view(num_tokens, h, d)
            kv = qkv[:, q_size:].view(num_tokens, 2, kvh, d)  # the cache's slot layout
            cache.write(li, meta.slot_mapping, kv)
            if li == last and logits_idx.numel() == 0:  # only mid-prompt chunks: no row samples
                return x.new_empty((0, cfg.vocab_size), dtype=torch.float32)
            attn = self._attention(li, q, kv, meta, cache).reshape(num_tokens, q_size)
            if li == last and select:
                attn, x = attn[logits_idx], x[logits_idx]  # (copies: x's other rows are never read again)
            hs = self._add_norm(x, layer.o(attn), layer.mlp_norm)
            delta = layer.down(self._silu_mul(layer.gate_up(hs)))
        assert delta is not None
        if not select:  # every row has logits, in logits_idx's order
            x, delta = x[logits_idx], delta[logits_idx]
        return self.lm_head(self._add_norm(x.contiguous(), delta.contiguous(), self.final_norm)).float()

    def _add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        """``x += delta`` in place (the residual), then x's RMSNorm: one pass with the native glue."""
        if self.glue is not None:
            return self.glue.add_rms_norm(x, None if delta is None else delta.contiguous(), weight,
                                          self.cfg.rms_norm_eps)
        if delta is not None:
            x.add_(delta)
        return F.rms_norm(x, (self.cfg.hidden_size,), weight, self.cfg.rms_norm_eps)

    def _rope(self, qkv: torch.Tensor, positions: torch.Tensor) -> None:
        """RoPE on the q and k heads of ``qkv`` in place (adjacent there; pairs interleaved, see
        ``_interleave``, so it is a complex multiply)."""
        cfg = self.cfg
        heads = cfg.num_heads + cfg.num_kv_heads
        if self.glue is not None:
            self.glue.rope_(qkv, positions, self._rope_pairs, heads)
            return
        qk = qkv[:, :heads * cfg.head_dim]
        rope = self.rope_table[positions].unsqueeze(1)  # [T, 1, d/2] complex
        rotated = torch.view_as_complex(qk.float().reshape(qkv.shape[0], heads, cfg.head_dim // 2, 2)) * rope
        qk.copy_(torch.view_as_real(rotated).view(qkv.shape[0], heads * cfg.head_dim))

    def _silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.glue is not None:
            return self.glue.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def mlp_residual(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus the layer's SwiGLU MLP of its normed value (shared with the compiled decode path)."""
        hs = F.rms_norm(x, (self.cfg.hidden_size,), layer.mlp_norm, self.cfg.rms_norm_eps)
        gate, up = layer.gate_up(hs).chunk(2, dim=-1)
        return x + layer.down(F.silu(gate) * up)

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
            if self.paged_attention is not None and meta.decode_lens is not None:
                o = self.paged_attention(qd.reshape(bd, h, d), cache.kv, li, meta.decode_slots, meta.decode_lens)
            else:
                assert meta.decode_slots is not None  # the runner sets it with decode_token_idx
                ctx = cache.gather(li, meta.decode_slots).to(q.dtype)  # [Bd, L, 2, kvh, d]
                o = F.scaled_dot_product_attention(qd, ctx[:, :, 0].transpose(1, 2), ctx[:, :, 1].transpose(1, 2),
                                                   attn_mask=meta.decode_mask)
            if meta.all_decode:
                return o.reshape(bd, h, d)
            out = torch.empty_like(q)
            out[meta.decode_token_idx] = o.reshape(bd, h, d)
        else:
            out = torch.empty_like(q)
        at = self.prompt_attention_dtype
        for chunk in meta.prefills:
            sl = slice(chunk.token_start, chunk.token_start + chunk.num_tokens)
            if chunk.paged_start is not None and self.prefill_attention is not None:
                out[sl] = self.prefill_attention(q[sl], cache.kv, li, chunk.context_slots, chunk.paged_start,
                                                 self.prompt_attention_bf16)
                continue
            qp = q[sl].transpose(0, 1).unsqueeze(0).to(at)  # [1, h, n, d]
            if chunk.context_slots is None:  # a first chunk sees only itself: causal, no gather
                kp, vp = kv[sl, 0].to(at), kv[sl, 1].to(at)
                o = F.scaled_dot_product_attention(qp, kp.transpose(0, 1).unsqueeze(0),
                                                   vp.transpose(0, 1).unsqueeze(0),
                                                   is_causal=True, enable_gqa=True)
            else:
                ctx = cache.gather(li, chunk.context_slots).to(at)  # [L, 2, kvh, d]
                o = F.scaled_dot_product_attention(qp, ctx[:, 0].transpose(0, 1).unsqueeze(0),
                                                   ctx[:, 1].transpose(0, 1).unsqueeze(0),
                                                   attn_mask=chunk.mask, enable_gqa=True)
            out[sl] = o.squeeze(0).transpose(0, 1)  # (copied back in q's dtype)
        return out


def _interleave(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder each head's rows from the half-split RoPE layout (HF: pairs (i, i + d/2)) to the
    interleaved one (pairs (2i, 2i + 1)). q and k get the same order, so q.k is unchanged, and RoPE
    becomes a complex multiply on adjacent pairs."""
    rows = w.shape[0]
    d = rows // num_heads
    rest = w.shape[1:]
    return w.reshape(num_heads, 2, d // 2, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()
