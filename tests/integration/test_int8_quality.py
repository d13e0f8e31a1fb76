"""int8 and int4 weights on the real SmolLM2-135M against its float32 self (the full 50 x 32 figure is in
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


# int8: a quarter of the bytes, plus scales and norms; int4: the layers at 4.5 bits, the embedding int8
@pytest.mark.parametrize(("fmt", "max_bytes_share"), [("int8", 0.27), ("int4", 0.19)])
def test_quantized_agrees_with_float32(pulled_models: dict[str, Path], fmt: str, max_bytes_share: float) -> None:
    torch.set_num_threads(2)
    folder = pulled_models["smollm2-135m-instruct"]
    dense = LlamaModel.from_folder(folder, torch.device("cpu"), torch.float32, "none")
    quantized = LlamaModel.from_folder(folder, torch.device("cpu"), torch.float32, fmt)
    assert quantized.weight_bytes() < max_bytes_share * dense.weight_bytes()
    assert quantized.num_params() == dense.num_params()
    result = measure_agreement(dense, quantized, chat_prompts(load_tokenizer(folder), 8), 32)
    assert result.num_tokens == 8 * 32
    assert result.teacher_forced >= MIN_TEACHER_FORCED
    assert result.max_rel_logit_diff <= MAX_REL_LOGIT_DIFF
