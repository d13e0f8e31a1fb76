"""How long a step takes, as a function of what is in it: the simulator's stand-in for the device.

LLM step: ``base_s + per_token_s * tokens + per_seq_s * seqs + per_ctx_token_s * context tokens``
(weights read once per step, GEMM work per token, per-sequence overheads, attention over the cache).
Embedding batch: ``embed_base_s + embed_per_token_s * tokens``. ``homeai bench calibrate`` fits the
coefficients on the real runtime of the machine it runs on; the GPU profile comes from published
figures for a 8B model in bf16 on a 24 GB consumer card (about 1 TB/s: ~16 ms to read the weights
once per step, prefill about 10k tokens/s).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class CostModel:
    name: str
    base_s: float
    per_token_s: float
    per_seq_s: float
    per_ctx_token_s: float
    embed_base_s: float
    embed_per_token_s: float

    def llm_step_s(self, num_tokens: int, num_seqs: int, num_ctx_tokens: int) -> float:
        return (self.base_s + self.per_token_s * num_tokens + self.per_seq_s * num_seqs
                + self.per_ctx_token_s * num_ctx_tokens)

    def embed_batch_s(self, num_tokens: int) -> float:
        return self.embed_base_s + self.embed_per_token_s * num_tokens

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> CostModel:
        return cls(**json.loads(path.read_text()))


PROFILES = {
    "gpu-8b": CostModel("gpu-8b", base_s=0.016, per_token_s=0.0001, per_seq_s=0.00005, per_ctx_token_s=2e-8,
                        embed_base_s=0.002, embed_per_token_s=0.000005),
    # A 1B model in bf16 on the same card: ~2 GB of weights read per step, as voice's small model beside gpu-8b.
    "gpu-1b": CostModel("gpu-1b", base_s=0.0025, per_token_s=0.00002, per_seq_s=0.00002, per_ctx_token_s=5e-9,
                        embed_base_s=0.002, embed_per_token_s=0.000005),
    # SmolLM2-135M fp32 on a 2-core CPU at nominal speed (~27 GB/s, ~350 GFLOP/s); `calibrate` replaces it.
    "cpu-135m": CostModel("cpu-135m", base_s=0.022, per_token_s=0.0008, per_seq_s=0.0003, per_ctx_token_s=4e-7,
                          embed_base_s=0.004, embed_per_token_s=0.00015),
}


def resolve_profile(name_or_path: str) -> CostModel:
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if path.exists():
        return CostModel.load(path)
    raise ValueError(f"unknown cost profile {name_or_path!r}: use one of {sorted(PROFILES)} or a JSON file "
                     f"written by `homeai bench calibrate`")
