"""A model folder of random weights of a known shape, for a machine that has no model files and no registry.

A GPU box lent for a speed check cannot download Llama-3.2-1B, and its weights are too large to carry
there; the speed bench builds random weights in memory (``--shape``), but the server loads models from
the repository. This writes what `homeai pull FOLDER` registers: ``config.json`` of the shape, its
weights as one ``model.safetensors`` (the speed bench's ``RandomWeights``, so both benches measure the
same tensors) and a real model's tokenizer files beside them. The speed of a step does not depend on
the values; token ids the tokenizer lacks (a 128k-row head over SmolLM2's 49k tokenizer) decode to
nothing. With ``--policy-out`` it also writes the default policy's LLM classes on that model (the
embedding classes left out: their encoder's files are not there either). Run it where the model will be
served (``deploy/gpu-check/check.sh``):

    python -m homeai.bench.random_model --shape llama-3.2-1b --tokenizer-from FOLDER --out FOLDER \
        [--policy-out FILE --name NAME]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

from homeai.api.settings import DEFAULT_POLICY
from homeai.bench.shapes import SHAPES
from homeai.bench.speed_bench import RandomWeights
from homeai.runtime.llama_config import LlamaConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def hf_config(cfg: LlamaConfig, dtype: torch.dtype) -> dict[str, Any]:
    """``cfg`` as a Hugging Face Llama ``config.json`` (what ``LlamaConfig.from_hf`` reads back)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings, "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_ids or None, "hidden_act": "silu",
            "torch_dtype": str(dtype).removeprefix("torch.")}


def write_random_model(cfg: LlamaConfig, out: Path, tokenizer_from: Path,
                       dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the folder (made if missing) and return it. The tokenizer folder must hold tokenizer.json."""
    if not (tokenizer_from / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {tokenizer_from}")
    out.mkdir(parents=True, exist_ok=True)
    weights = RandomWeights(cfg)
    save_file({name: weights[name].to(dtype).contiguous() for name in weights}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(hf_config(cfg, dtype), indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copyfile(tokenizer_from / name, out / name)
    return out


def llm_only_policy(base: dict[str, Any], model: str) -> dict[str, Any]:
    """``base`` (a policy document) with its LLM classes on ``model`` and its other classes left out, users,
    aliases and model settings following."""
    out = dict(base)
    classes = {n: {**c, "model": model} for n, c in base["classes"].items() if c.get("kind") == "llm"}
    out["classes"] = classes
    fallback = next(iter(classes))
    users = {}
    for name, user in (base.get("users") or {}).items():
        user = dict(user)
        allowed = [c for c in user.get("allowed_classes", ["*"]) if c == "*" or c in classes]
        user["allowed_classes"] = allowed or [fallback]
        if user.get("default_class") not in classes:
            user["default_class"] = next((c for c in allowed if c != "*"), fallback)
        users[name] = user
    out["users"] = users
    out["aliases"] = {n: {**a, "model": model} if "model" in a else a for n, a in (base.get("aliases") or {}).items()
                      if a.get("class", n) in classes}
    settings = list((base.get("models") or {}).values())
    out["models"] = {model: settings[0]} if settings else {}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m homeai.bench.random_model", description=__doc__.splitlines()[0])
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--tokenizer-from", required=True, type=Path, help="a model folder holding tokenizer.json")
    p.add_argument("--out", required=True, type=Path, help="the folder to write")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--policy-out", type=Path, help="also write the default policy's LLM classes on --name here")
    p.add_argument("--name", help="the model's name in the repository (for --policy-out)")
    p.add_argument("--policy-from", type=Path, default=DEFAULT_POLICY, help="the policy --policy-out starts from")
    args = p.parse_args(argv)
    if args.policy_out is not None and not args.name:
        p.error("--policy-out needs --name")
    folder = write_random_model(LlamaConfig(**SHAPES[args.shape]), args.out, args.tokenizer_from,
                                getattr(torch, args.dtype))
    print(folder)
    if args.policy_out is not None:
        policy = llm_only_policy(yaml.safe_load(args.policy_from.read_text()), args.name)
        args.policy_out.write_text(yaml.safe_dump(policy, sort_keys=False))
        print(args.policy_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
