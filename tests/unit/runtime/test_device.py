"""Device choice, dtype names, and the resident-memory figure /v1/stats reports."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from homeai.runtime.device import default_dtype, parse_dtype

CPU = torch.device("cpu")


RSS_PROBE = """
import mmap
from homeai.runtime.device import process_rss_mb
before = process_rss_mb()
block = mmap.mmap(-1, 64 * 2**20)  # 64 MiB of fresh pages, none resident yet
block.write(b"x" * len(block))     # touched: now resident
print(before, process_rss_mb())
"""


def test_rss_follows_a_large_allocation() -> None:
    # In a fresh process with fresh pages: in the test process an allocation may reuse pages that a freed
    # tensor left resident (glibc's or torch's caches), and RSS would rightly not move.
    out = subprocess.run([sys.executable, "-c", RSS_PROBE], capture_output=True, text=True, check=True).stdout
    before, after = (float(x) for x in out.split())
    assert 60 <= after - before <= 80, (before, after)


def test_dtypes() -> None:
    assert default_dtype(CPU) == torch.float32 and parse_dtype("auto", CPU) == torch.float32
    assert parse_dtype("bf16", CPU) == torch.bfloat16
    with pytest.raises(ValueError, match="int8"):
        parse_dtype("int8", CPU)


def test_in_passing_thread_runs_in_a_thread_that_has_ended() -> None:
    import threading

    from homeai.runtime.device import in_passing_thread

    ran_in: list[threading.Thread] = []

    def work(a: int, b: int) -> int:
        ran_in.append(threading.current_thread())
        return a + b

    assert in_passing_thread(work, 2, 3) == 5
    assert ran_in[0] is not threading.current_thread() and not ran_in[0].is_alive()  # its OpenMP pool is gone

    def fails() -> None:
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        in_passing_thread(fails)
