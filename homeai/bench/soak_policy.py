"""The soak's policy, in two variants that the soak swaps between every 30 s.

Every kind of class runs at once: a voice class that fails fast, a chat class, a one-slot ``storm``
class whose tiny queue turns bursts into 429 storms, an interactive embedding class (requests and
search) and the background ``indexing`` class. Answers are short so that a CPU keeps up; the variants
differ in limits the scheduler must apply live (output caps, running caps, queue sizes).
"""

from __future__ import annotations

from typing import Any

import yaml

LLM = "smollm2-135m-instruct"
ENCODER = "all-minilm-l6-v2"
STORM_CLASS = "storm"
SEARCH_USER = "searcher"


def soak_policy(variant: int) -> dict[str, Any]:
    """Variant 0 or 1 (anything else is taken modulo 2)."""
    b = variant % 2 == 1
    return {
        "version": 1,
        "classes": {
            "voice": {"kind": "llm", "model": LLM, "priority": 0, "max_running": 6 if b else 8,
                      "max_output_tokens": 8,
                      "default_queue_policy": {"max_queue_size": 16, "timeout_action": "REJECT",
                                               "default_timeout_microseconds": 10_000_000}},
            "chat": {"kind": "llm", "model": LLM, "priority": 1, "max_output_tokens": 16 if b else 24,
                     "default_queue_policy": {"max_queue_size": 64, "timeout_action": "DELAY",
                                              "default_timeout_microseconds": 30_000_000}},
            STORM_CLASS: {"kind": "llm", "model": LLM, "priority": 1, "max_running": 1, "max_output_tokens": 4,
                          "default_queue_policy": {"max_queue_size": 3 if b else 2, "timeout_action": "REJECT",
                                                   "default_timeout_microseconds": 2_000_000}},
            "embedding": {"kind": "embedding", "model": ENCODER, "priority": 1, "max_batch_size": 32,
                          "max_queue_delay_microseconds": 2000, "max_prompt_tokens": 256,
                          "default_queue_policy": {"max_queue_size": 256}},
            "indexing": {"kind": "embedding", "model": ENCODER, "priority": 2, "background": True,
                         "min_share": 0.1, "max_batch_size": 32, "preferred_batch_size": [32],
                         "max_queue_delay_microseconds": 20_000, "max_prompt_tokens": 256,
                         "default_queue_policy": {"max_queue_size": 10_000}},
        },
        "users": {
            "default": {"default_class": "chat"},
            "kids": {"allowed_classes": ["voice"], "default_class": "voice"},
            "indexer": {"allowed_classes": ["embedding", "indexing"], "default_class": "indexing"},
        },
        "aliases": {"voice": {"model": LLM, "class": "voice"}},
        "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 16},
    }


def soak_policy_yaml(variant: int) -> str:
    return yaml.safe_dump(soak_policy(variant), sort_keys=False)
