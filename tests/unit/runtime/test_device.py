"""Device choice, dtype names, and the resident-memory figure /v1/stats reports."""

from __future__ import annotations

import pytest
import torch

from homeai.runtime.device import default_dtype, parse_dtype, process_rss_mb

CPU = torch.device("cpu")


def test_rss_follows_a_large_allocation() -> None:
    before = process_rss_mb()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    after = process_rss_mb()
    assert after - before >= 50 and block.numel() > 0


def test_dtypes() -> None:
    assert default_dtype(CPU) == torch.float32 and parse_dtype("auto", CPU) == torch.float32
    assert parse_dtype("bf16", CPU) == torch.bfloat16
    with pytest.raises(ValueError, match="int8"):
        parse_dtype("int8", CPU)
