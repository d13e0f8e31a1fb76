"""The KV pool's pages are made resident just ahead of the blocks handed out, and never clobbered."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from waiting import wait_until

from homeai.core.block_manager import BlockManager
from homeai.runtime import kv_prefault
from homeai.runtime.kv_cache import KVCache

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")


def resident_pages(t: torch.Tensor) -> int:
    """Pages of ``t`` resident now (mincore), so the test sees the kernel's view, not our counter."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    lo = t.data_ptr() - t.data_ptr() % page
    hi = t.data_ptr() + t.numel() * t.element_size()
    n = -(-(hi - lo) // page)
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) == 0
    return sum(b & 1 for b in vec)


class InlineThread:
    """Runs the populating thread's body when it is started, so which blocks it populates is checked
    without a race against the suite's other threads (test_populating_keeps_what_was_written runs the
    real thread)."""

    def __init__(self, target: Callable[[], None], name: str, daemon: bool) -> None:
        self._target = target

    def start(self) -> None:
        self._target()


def test_blocks_ahead_of_the_highest_handed_out_become_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_prefault, "AHEAD_BLOCKS", 3)
    # Only this module's names are replaced: other threads of the suite keep the real ones.
    monkeypatch.setattr(kv_prefault, "threading", SimpleNamespace(
        Thread=InlineThread, Lock=threading.Lock, get_native_id=threading.get_native_id))
    monkeypatch.setattr(kv_prefault, "os", SimpleNamespace(  # nice 19 would stay with the test's thread
        setpriority=lambda *_args: None, PRIO_PROCESS=os.PRIO_PROCESS))
    # (Whether untouched pages read as non-resident depends on the kernel's huge pages: only populating is
    # asserted, and that it stops 3 blocks past the highest handed out.)
    cache = KVCache(num_layers=2, num_blocks=2048, block_size=16, num_kv_heads=2, head_dim=64,
                    device=torch.device("cpu"), dtype=torch.float32)
    assert cache.prefault is not None
    bm = BlockManager(2048, 16)
    bm.on_block = cache.prefault.handed_out

    # Each handed-out block more than half the margin (3 // 2 = 1) short of the populated end moves the end
    # to that block + 1 + 3: block 0 to 4, block 3 to 7; blocks 1, 2 and 4 leave it.
    # (The test used to wait for 8, which the real thread reached only when it lost the race to block 4:
    # when it won, the end stayed at 7 and the wait ran out; that was the "unpopulated" flake.)
    blocks = bm.allocate(seq_id=1, num_tokens=16 * 5)
    assert blocks == [0, 1, 2, 3, 4]
    assert cache.prefault.populated_blocks == 7
    for layer in range(2):  # the kernel's view, not only our counter
        assert resident_pages(cache.kv[layer, 6 * 16:7 * 16]) > 0
    bm.allocate(seq_id=2, num_tokens=16)  # block 5: 5 + 1 + 1 <= 7, nothing to do
    assert cache.prefault.populated_blocks == 7
    bm.allocate(seq_id=3, num_tokens=16)  # block 6: the margin is used, up to 6 + 1 + 3
    assert cache.prefault.populated_blocks == 10
    assert resident_pages(cache.kv[1, 9 * 16:10 * 16]) > 0
    cache.prefault.stop()


def test_populating_keeps_what_was_written() -> None:
    cache = KVCache(num_layers=3, num_blocks=16, block_size=16, num_kv_heads=2, head_dim=64,
                    device=torch.device("cpu"), dtype=torch.float32)
    assert cache.prefault is not None
    kv = torch.randn(16, 2, 2, 64)
    for layer in range(3):
        cache.write(layer, torch.arange(16, 32), kv)  # block 1 written before its pages are populated
    cache.prefault.handed_out(15)
    pf = cache.prefault
    wait_until(lambda: pf.populated_blocks == 16,
               what=lambda: f"the whole pool populated (populated {pf._done}, target {pf._target}, running "
                            f"{pf._running}, stopped {pf._stopped}, threads {[t.name for t in threading.enumerate()]})")
    for layer in range(3):
        assert torch.equal(cache.gather(layer, torch.arange(16, 32)), kv)
        assert not cache.gather(layer, torch.arange(32, 48)).any()  # populated pages read as zeros
    cache.prefault.stop()
