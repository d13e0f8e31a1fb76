"""Makes the KV pool's pages resident just ahead of the blocks the block manager hands out.

The pool is allocated lazily (calloc'd zero pages: resident only once written), so the step that first
writes a block pays its page faults: 16 tokens of SmolLM2's float32 KV are 180 pages across the layers.
On bare metal that is ~0.1 ms a block; in a virtual machine whose host backs guest memory on first touch
(this project's 2-core test box) it was ~29 us a page: 28-40 ms of a 46-token prompt's ~100 ms. Blocks are
handed out lowest id first, so a thread that populates the blocks just past the highest one handed out
(``MADV_POPULATE_WRITE``: pages faulted in without their content being touched, so it may run beside the
device thread's writes) moves that cost off the request path, while the pool stays resident only as far
as the household has used it, plus ``AHEAD_BLOCKS``.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

AHEAD_BLOCKS = 48  # populated past the highest block handed out: a 768-token prompt's worth
CHUNK_BLOCKS = 4  # per madvise round: the thread checks for shutdown this often
TRANSIENT_RETRIES = 5  # EINTR / EAGAIN: try again before giving the pool up to first-use faults
MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels answer EINVAL and the pool faults as before


class KVPrefaulter:
    """Background population of a CPU KV tensor laid out [layers, slots, ...], block by block. A thread
    runs while it is behind (``AHEAD_BLOCKS`` past the highest block handed out) and ends once it caught up;
    the next one starts when half of that margin is used."""

    def __init__(self, kv: torch.Tensor, num_blocks: int, block_size: int) -> None:
        self._kv = kv  # held: a thread still populating keeps the pool mapped (an unloaded model's included)
        self._base = kv.data_ptr()
        self._layer_bytes = kv[0].numel() * kv.element_size()
        self._block_bytes = block_size * kv[0, 0].numel() * kv.element_size()
        self._num_layers = kv.shape[0]
        self._num_blocks = num_blocks
        self._done = 0  # blocks [0, done) are resident
        self._target = 0
        self._lock = threading.Lock()
        self._running = False
        self._stopped = False
        self._madvise = _libc_madvise()

    @property
    def populated_blocks(self) -> int:
        return self._done

    def handed_out(self, block: int) -> None:
        """The block manager handed out ``block`` (called on the device thread: one comparison mostly)."""
        if block + 1 + AHEAD_BLOCKS // 2 <= self._done or self._stopped or self._madvise is None:
            return
        with self._lock:
            self._target = max(self._target, min(self._num_blocks, block + 1 + AHEAD_BLOCKS))
            if self._running or self._done >= self._target:
                return
            self._running = True
        threading.Thread(target=self._run, name="homeai-kv-prefault", daemon=True).start()

    def stop(self) -> None:
        self._stopped = True

    def _run(self) -> None:
        try:  # the least important thread: it only saves live steps their page faults
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while True:
            with self._lock:
                if self._stopped or self._done >= self._target:
                    self._running = False
                    return
                start, end = self._done, min(self._target, self._done + CHUNK_BLOCKS)
            if not self._populate(start, end):
                with self._lock:
                    self._stopped, self._running = True, False
                return
            self._done = end

    def _populate(self, start: int, end: int) -> bool:
        """Fault in blocks [start, end) of every layer; False once the kernel refuses (then never again)."""
        page = mmap.PAGESIZE
        for layer in range(self._num_layers):
            lo = self._base + layer * self._layer_bytes + start * self._block_bytes
            hi = lo + (end - start) * self._block_bytes
            lo, hi = lo - lo % page, hi + (-hi) % page
            assert self._madvise is not None
            for attempt in range(TRANSIENT_RETRIES + 1):
                if self._madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_POPULATE_WRITE) == 0:
                    break
                err = ctypes.get_errno()
                if err not in (errno.EINTR, errno.EAGAIN) or attempt == TRANSIENT_RETRIES:
                    log.warning("KV pool pages fault in on first use: madvise(MADV_POPULATE_WRITE) failed (%s)",
                                errno.errorcode.get(err, err))
                    return False
                time.sleep(0.01)  # interrupted or busy: the kernel asks to try again
        return True


def _libc_madvise() -> Callable[[ctypes.c_void_p, ctypes.c_size_t, int], int] | None:
    """libc's madvise (ctypes releases the GIL around it), or None off Linux.

    Looked up in the symbols the process already has (``dlopen(NULL)``), not with
    ``ctypes.util.find_library``, which runs ``ldconfig`` in a subprocess and answers None when that fails
    (no free file descriptor, say): the pool would then fault on first use with nothing logged."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError) as exc:
        log.warning("KV pool pages fault in on first use: libc's madvise not found (%s)", exc)
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn
