"""Native CPU kernels, compiled at first use and cached: today one, the int8 weight-only linear layer.

Why native: see ``int8_linear.cpp`` (torch's int8 kernel reads weights at half the bandwidth a decode step
could use). The build takes a few seconds with the C++ compiler torch.compile needs anyway; its output
lives under the cache directory (``<cache>/kernels/``), so later starts only load it. Without a compiler,
or on a CPU without AVX2, ``int8_linear()`` returns None and the caller keeps torch's kernels (logged once).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_SOURCES = (_HERE / "int8_linear.cpp", _HERE / "int8_linear_kernel.inc")
_DISABLE_ENV = "HOMEAI_NATIVE_KERNELS"  # "0": never build or use them (torch's kernels only)
_lock = threading.Lock()
_loaded: dict[str, Callable[..., torch.Tensor] | None] = {}


def _build_dir() -> Path:
    """One folder per source version and torch version, under the cache directory."""
    from homeai.repository.cache import default_cache_dir

    digest = hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES) + torch.__version__.encode())
    return default_cache_dir() / "kernels" / f"int8_linear-{digest.hexdigest()[:12]}"


def _build() -> Callable[..., torch.Tensor]:
    from torch.utils.cpp_extension import load

    folder = _build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    load(name="homeai_int8_linear", sources=[str(_SOURCES[0])], build_directory=str(folder),
         extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"], extra_include_paths=[str(_HERE)],
         is_python_module=False, verbose=False)

    @torch.library.register_fake("homeai::int8_linear")
    def _(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], q.shape[0])

    return torch.ops.homeai.int8_linear.default


def _cpu_has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def int8_linear() -> Callable[..., torch.Tensor] | None:
    """``op(x [M, K] float32, q [N, K] int8, scale [N] float32) -> [M, N] float32`` (CPU tensors, K a
    multiple of 16), or None where it cannot be built or used here."""
    with _lock:
        if "int8_linear" not in _loaded:
            op = None
            if os.environ.get(_DISABLE_ENV, "1") == "0":
                log.info("native kernels off (%s=0): int8 layers use torch's kernels", _DISABLE_ENV)
            elif not _cpu_has_avx2():
                log.info("no AVX2 on this CPU: int8 layers use torch's kernels")
            else:
                try:
                    op = _build()
                except Exception as exc:  # noqa: BLE001 - no compiler, no headers: torch's kernels still work
                    log.warning("native int8 kernel unavailable, int8 layers use torch's kernels: %s", exc)
            _loaded["int8_linear"] = op
        return _loaded["int8_linear"]
