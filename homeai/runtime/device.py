"""Chooses the device once at start: CUDA when present, else the CPU (with its thread count set)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def choose_device(requested: str | None = None) -> torch.device:
    """``requested`` (or HOMEAI_DEVICE) wins; otherwise cuda if available, else cpu."""
    name = requested or os.environ.get("HOMEAI_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cpu":
        threads = int(os.environ.get("HOMEAI_CPU_THREADS", "0")) or (os.cpu_count() or 1)
        torch.set_num_threads(threads)
    return device


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on the CPU (bf16 is slower there without AMX); bf16 on a GPU that supports it."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "", "auto"):
        return default_dtype(device)
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(table)}")
    return table[name]


def process_rss_mb() -> float:
    """This process's resident memory now, in MB (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KB on Linux


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``). Loading frees many tensor-sized
    temporaries (a float copy per tensor before it is quantized); glibc keeps them in its arenas, so
    without this the resident size at ready counts memory the process no longer uses. A no-op elsewhere."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def in_passing_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a thread that ends when it returns, and return (or raise) what it did.

    Why: each thread that runs parallel torch ops gets its own OpenMP thread pool, kept while the
    thread lives, and libgomp stops spinning (waits as if passive) once the pools' threads outnumber
    the CPUs. Loading models or running a rival benchmark on a long-lived thread (the main thread, an
    executor's) would leave a second pool beside the device thread's for good: one decode stream
    measured 20 instead of 29-35 tok/s here. A thread that ends frees its pool.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            error.append(exc)

    thread = threading.Thread(target=run, name="homeai-load")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
