"""A BERT encoder in plain torch, its weights read straight from the folder's safetensors.

`transformers.AutoModel` imports the whole modeling stack (PreTrainedModel, generation, integrations):
~100 MB resident for the life of the server, to run what is six layers of a few matmuls for MiniLM. This
module is those layers and nothing else: inference only (no dropout, no pooler, no heads), every item's
token types 0 (sentence encoders take one segment), padding masked out of attention.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from homeai.runtime.device import release_free_memory

SUPPORTED_MODEL_TYPES = ("bert",)

# config.json's hidden_act -> function, as transformers' ACT2FN maps the names (BERT's "gelu" is the exact erf
# form; "gelu_new" is the tanh approximation).
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@dataclass(frozen=True, slots=True)
class BertConfig:
    """The sizes and constants of config.json the forward uses; anything it cannot run is refused here."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_folder(cls, folder: Path) -> BertConfig:
        """Read ``folder/config.json``; ValueError naming the folder for an architecture we do not run."""
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: no config.json")
        raw = json.loads(path.read_text())
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{folder}: model_type {model_type!r} (architectures {raw.get('architectures')}) is not supported "
                f"by the embedder; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{folder}: position_embedding_type {raw['position_embedding_type']!r} is not supported")
        cfg = cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            hidden_act=str(raw.get("hidden_act", "gelu")),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
        )
        if cfg.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"{folder}: hidden_act {cfg.hidden_act!r} is not supported ({', '.join(_ACTIVATIONS)})")
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError(f"{folder}: hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads "
                             f"{cfg.num_attention_heads}")
        return cfg

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint names (without any "bert." prefix) of every tensor the forward needs, with shapes."""
        h, i = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {
            "embeddings.word_embeddings.weight": (self.vocab_size, h),
            "embeddings.position_embeddings.weight": (self.max_position_embeddings, h),
            "embeddings.token_type_embeddings.weight": (self.type_vocab_size, h),
            "embeddings.LayerNorm.weight": (h,),
            "embeddings.LayerNorm.bias": (h,),
        }
        for n in range(self.num_hidden_layers):
            p = f"encoder.layer.{n}."
            for proj in ("query", "key", "value"):
                shapes[f"{p}attention.self.{proj}.weight"] = (h, h)
                shapes[f"{p}attention.self.{proj}.bias"] = (h,)
            shapes.update({
                f"{p}attention.output.dense.weight": (h, h),
                f"{p}attention.output.dense.bias": (h,),
                f"{p}attention.output.LayerNorm.weight": (h,),
                f"{p}attention.output.LayerNorm.bias": (h,),
                f"{p}intermediate.dense.weight": (i, h),
                f"{p}intermediate.dense.bias": (i,),
                f"{p}output.dense.weight": (h, i),
                f"{p}output.dense.bias": (h,),
                f"{p}output.LayerNorm.weight": (h,),
                f"{p}output.LayerNorm.bias": (h,),
            })
        return shapes


@dataclass(slots=True)
class _Layer:
    """One encoder layer; q/k/v fused into one [3H, H] matmul."""

    qkv_w: torch.Tensor
    qkv_b: torch.Tensor
    attn_out_w: torch.Tensor
    attn_out_b: torch.Tensor
    attn_norm_w: torch.Tensor
    attn_norm_b: torch.Tensor
    inter_w: torch.Tensor
    inter_b: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor
    out_norm_w: torch.Tensor
    out_norm_b: torch.Tensor


def read_bert_weights(folder: Path, cfg: BertConfig) -> dict[str, torch.Tensor]:
    """The tensors ``cfg`` needs from the folder's ``*.safetensors`` (CPU), keyed without a "bert." prefix.

    BertModel checkpoints name tensors ``embeddings.*``; BertFor* ones (masked LM, pre-training) prefix them
    with ``bert.``. Pooler and head tensors are not read.
    """
    paths = sorted(Path(folder).glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    expected = cfg.expected_shapes()
    found: dict[str, torch.Tensor] = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - not a dict
                name = key.removeprefix("bert.")
                if name in expected and name not in found:
                    found[name] = f.get_tensor(key)
    missing = [name for name in expected if name not in found]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ValueError(f"{folder}: BERT weights missing from the safetensors: {', '.join(missing[:3])}{more}")
    for name, shape in expected.items():
        if tuple(found[name].shape) != shape:
            raise ValueError(f"{folder}: {name} has shape {tuple(found[name].shape)}, config.json says {shape}")
    return found


class BertEncoder:
    """BERT's encoder forward: ids (+ padding mask) -> last hidden states, as transformers' BertModel gives."""

    def __init__(self, cfg: BertConfig, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype = torch.float32) -> None:
        self.config = cfg
        self.device = torch.device(device)
        self.dtype = dtype

        def take(name: str) -> torch.Tensor:
            return weights.pop(name).to(device=self.device, dtype=dtype).contiguous()

        self.word_embeddings = take("embeddings.word_embeddings.weight")
        self.position_embeddings = take("embeddings.position_embeddings.weight")
        self.token_type_0 = take("embeddings.token_type_embeddings.weight")[0].clone()  # every token is type 0
        self.embed_norm_w = take("embeddings.LayerNorm.weight")
        self.embed_norm_b = take("embeddings.LayerNorm.bias")
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.layers: list[_Layer] = []
        for n in range(cfg.num_hidden_layers):
            p = f"encoder.layer.{n}."
            qkv = [(take(f"{p}attention.self.{x}.weight"), take(f"{p}attention.self.{x}.bias"))
                   for x in ("query", "key", "value")]
            self.layers.append(_Layer(
                qkv_w=torch.cat([w for w, _ in qkv]),
                qkv_b=torch.cat([b for _, b in qkv]),
                attn_out_w=take(f"{p}attention.output.dense.weight"),
                attn_out_b=take(f"{p}attention.output.dense.bias"),
                attn_norm_w=take(f"{p}attention.output.LayerNorm.weight"),
                attn_norm_b=take(f"{p}attention.output.LayerNorm.bias"),
                inter_w=take(f"{p}intermediate.dense.weight"),
                inter_b=take(f"{p}intermediate.dense.bias"),
                out_w=take(f"{p}output.dense.weight"),
                out_b=take(f"{p}output.dense.bias"),
                out_norm_w=take(f"{p}output.LayerNorm.weight"),
                out_norm_b=take(f"{p}output.LayerNorm.bias"),
            ))

    @classmethod
    def from_folder(cls, folder: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> BertEncoder:
        """config.json + ``*.safetensors`` of a Hugging Face BERT folder, on ``device`` in ``dtype``.

        float32 on the CPU keeps most tensors as views of the file's (privately mapped) pages: resident only
        as used (the word embedding rows of tokens seen), and shared with the page cache. Safe because a
        pull renames new files into place and never rewrites a served one.
        """
        cfg = BertConfig.from_folder(folder)
        model = cls(cfg, read_bert_weights(folder, cfg), device, dtype)
        release_free_memory()  # the float32 CPU copies and the unfused q/k/v are gone: give their pages back
        return model

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states [B, L, hidden] for ``input_ids`` [B, L]; ``attention_mask`` [B, L] is nonzero on
        real tokens (None: no padding). Padded positions get values too; callers mask them when pooling."""
        cfg = self.config
        batch, length = input_ids.shape
        if length > cfg.max_position_embeddings:
            raise ValueError(f"{length} tokens, more than max_position_embeddings {cfg.max_position_embeddings}")
        h = cfg.hidden_size
        x = F.embedding(input_ids, self.word_embeddings) + self.token_type_0
        x = x + self.position_embeddings[:length]
        x = F.layer_norm(x, (h,), self.embed_norm_w, self.embed_norm_b, cfg.layer_norm_eps)
        # [B, 1, 1, L]: every query row attends to its item's real tokens only (each item has at least one).
        mask = None if attention_mask is None else attention_mask.to(torch.bool)[:, None, None, :]
        for layer in self.layers:
            qkv = F.linear(x, layer.qkv_w, layer.qkv_b).view(batch, length, 3, cfg.num_attention_heads, cfg.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, L, head_dim]
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(batch, length, h)
            x = F.layer_norm(F.linear(ctx, layer.attn_out_w, layer.attn_out_b) + x, (h,),
                             layer.attn_norm_w, layer.attn_norm_b, cfg.layer_norm_eps)
            inner = self.act(F.linear(x, layer.inter_w, layer.inter_b))
            x = F.layer_norm(F.linear(inner, layer.out_w, layer.out_b) + x, (h,),
                             layer.out_norm_w, layer.out_norm_b, cfg.layer_norm_eps)
        return x
