"""Model shapes the speed and kernel benches build random weights of (no download): SmolLM2-135M, which the
tests serve, and Llama-3.2-1B, the size a household GPU serves. Kept apart from the benches so the CLI
lists them without importing torch."""

from __future__ import annotations

from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_layers": 30,
                     "num_heads": 9, "num_kv_heads": 3, "head_dim": 64, "rope_theta": 100000.0,
                     "max_position_embeddings": 8192, "tie_word_embeddings": True},
    "llama-3.2-1b": {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_layers": 16,
                     "num_heads": 32, "num_kv_heads": 8, "head_dim": 64, "rope_theta": 500000.0,
                     "max_position_embeddings": 8192, "tie_word_embeddings": True},
}
