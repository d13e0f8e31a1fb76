"""The KV cache's element type: float16 for quantized weights where the native decode kernel reads it, the
model's dtype otherwise, and HOMEAI_KV_CACHE_DTYPE to choose."""

from __future__ import annotations

import pytest
import torch

from homeai.runtime.kv_cache import KV_CACHE_DTYPE_ENV, KVCache, kv_cache_dtype


def test_auto_narrows_the_cache_only_for_quantized_weights_read_by_the_native_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KV_CACHE_DTYPE_ENV, raising=False)
    assert kv_cache_dtype(torch.float32, "int4", native_attention=True) == torch.float16
    assert kv_cache_dtype(torch.float32, "int8", native_attention=True) == torch.float16
    assert kv_cache_dtype(torch.float32, "none", native_attention=True) == torch.float32  # the exact reference
    assert kv_cache_dtype(torch.float32, "int4", native_attention=False) == torch.float32  # SDPA would widen it
    assert kv_cache_dtype(torch.bfloat16, "none", native_attention=False) == torch.bfloat16  # a GPU's dtype


def test_the_environment_chooses_and_a_wrong_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KV_CACHE_DTYPE_ENV, "float32")
    assert kv_cache_dtype(torch.float32, "int4", native_attention=True) == torch.float32
    monkeypatch.setenv(KV_CACHE_DTYPE_ENV, "bfloat16")
    assert kv_cache_dtype(torch.float32, "none", native_attention=True) == torch.bfloat16
    monkeypatch.setenv(KV_CACHE_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match=KV_CACHE_DTYPE_ENV):
        kv_cache_dtype(torch.float32, "int4", native_attention=True)


def test_a_float16_cache_stores_what_it_is_given_rounded_to_float16() -> None:
    cache = KVCache(num_layers=2, num_blocks=4, block_size=16, num_kv_heads=3, head_dim=64,
                    device=torch.device("cpu"), dtype=torch.float16)
    kv = torch.randn(5, 2, 3, 64) * 3
    slots = torch.tensor([0, 17, 18, 40, 63])
    cache.write(1, slots, kv)
    got = cache.gather(1, slots)
    assert got.dtype == torch.float16
    assert torch.equal(got, kv.half())
    assert not cache.gather(0, slots).any()  # the other layer untouched
    # half the bytes per block of a float32 cache: twice the tokens in the same memory
    assert KVCache.bytes_per_block(30, 16, 3, 64, torch.float16) * 2 == KVCache.bytes_per_block(30, 16, 3, 64,
                                                                                                  torch.float32)
