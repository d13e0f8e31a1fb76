"""Embeddings/s of one batched call vs one call per text, measured side by side in one process.

    python -m homeai.bench.embed_bench --folder PATH [--device cpu] [--dtype float32] [--threads N]

Prints one JSON object. Ratios from the same run are what count on a noisy shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from homeai.runtime.embedder import Embedder

_SHORT = [
    "Turn off the kitchen lights.",
    "What is the weather tomorrow?",
    "Play some jazz in the living room.",
    "Remind me to water the plants.",
    "How long do I boil an egg?",
    "Add milk to the shopping list.",
    "Who won the game last night?",
    "Set a timer for ten minutes.",
]


def _median_s(
    cases: dict[str, Callable[[], object]], rounds: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Median seconds per case; rounds interleave the cases so that load spikes hit them all alike."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():  # warm-up: allocator, kernels, tokenizer caches
        fn()
    for _ in range(rounds):
        for name, fn in cases.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def run(folder: Path, device: torch.device, dtype: torch.dtype, rounds: int, num_texts: int) -> dict:
    """Time `num_texts` short sentences as one batch and as single calls; also a mixed-length batch."""
    embedder = Embedder.load(folder, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    texts = [f"{_SHORT[i % len(_SHORT)]} ({i})" for i in range(num_texts)]
    mixed = [t + " and then some more words" * (i % 8) * 4 for i, t in enumerate(texts)]
    cases: dict[str, Callable[[], object]] = {
        "batch": lambda: embedder.embed(texts, batch_size=num_texts),
        "single": lambda: [embedder.embed([t]) for t in texts],
        "mixed_one_pad": lambda: embedder.embed(mixed, batch_size=num_texts),
        "mixed_sorted": lambda: embedder.embed(mixed, batch_size=8),
    }
    med = _median_s(cases, rounds, sync)
    batch_s, single_s = med["batch"], med["single"]
    mixed_one_pad_s, mixed_sorted_s = med["mixed_one_pad"], med["mixed_sorted"]
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "num_texts": num_texts,
        "mean_tokens_short": statistics.mean(embedder.count_tokens(texts)),
        "mean_tokens_mixed": statistics.mean(embedder.count_tokens(mixed)),
        "max_tokens_mixed": max(embedder.count_tokens(mixed)),
        "rounds": rounds,
        "batch_emb_per_s": num_texts / batch_s,
        "single_emb_per_s": num_texts / single_s,
        "batch_speedup": single_s / batch_s,
        "mixed_one_padded_batch_emb_per_s": num_texts / mixed_one_pad_s,
        "mixed_sorted_sub_batches_of_8_emb_per_s": num_texts / mixed_sorted_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="pulled sentence-transformers folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-texts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # on a busy shared CPU, fewer threads avoid OpenMP stalls
    result = run(
        args.folder, torch.device(args.device), getattr(torch, args.dtype), args.rounds, args.num_texts
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
