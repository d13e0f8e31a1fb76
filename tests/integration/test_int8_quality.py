"""int8 weights on the real SmolLM2-135M against its float32 self (the full 50 x 32 figure is in
``homeai bench quant``; this is the same measurement on fewer prompts).

Tolerances, measured on this model (whose float weights come from a Q4_1 GGUF): teacher-forced greedy
agreement 0.93-0.98 depending on the prompts, max |logit diff| 0.42-0.55 of the float logits' standard
deviation. The test holds both with margin so that it fails on a broken kernel or scale, not on noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from homeai.bench.quant_quality import chat_prompts, measure_agreement
from homeai.engine.builder import load_tokenizer
from homeai.runtime.llama import LlamaModel

pytestmark = pytest.mark.slow
MIN_TEACHER_FORCED = 0.90
MAX_REL_LOGIT_DIFF = 1.0  # in units of the float32 logits' standard deviation per position


def test_int8_agrees_with_float32(pulled_models: dict[str, Path]) -> None:
    torch.set_num_threads(2)
    folder = pulled_models["smollm2-135m-instruct"]
    dense = LlamaModel.from_folder(folder, torch.device("cpu"), torch.float32, "none")
    int8 = LlamaModel.from_folder(folder, torch.device("cpu"), torch.float32, "int8")
    assert int8.weight_bytes() < 0.27 * dense.weight_bytes()  # a quarter, plus scales and norms
    result = measure_agreement(dense, int8, chat_prompts(load_tokenizer(folder), 8), 32)
    assert result.num_tokens == 8 * 32
    assert result.teacher_forced >= MIN_TEACHER_FORCED
    assert result.max_rel_logit_diff <= MAX_REL_LOGIT_DIFF
