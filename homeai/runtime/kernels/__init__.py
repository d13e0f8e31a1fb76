"""Native CPU kernels for decode steps, compiled at first use and cached.

- ``int8_linear``: int8 weights, float32 activations (``int8_linear.cpp``): torch's int8 kernel reads
  weights at half the bandwidth a decode step could use. With it ``int8_to_bf16`` for prompt-sized
  inputs: torch's own int8 -> bfloat16 conversion costs more than the bfloat16 matmul after it; and
  ``int8_linear_tiled`` (same file), int16 activations through VNNI on weights in tiles of 16 rows, for
  the lm_head, whose float32-activation loop is bound by instructions rather than by reading the weights.
- ``int4_linear``: 4-bit weights in Q4_1's groups of 32 (``int4_linear.cpp``), float32 activations, at
  the int8 kernel's bandwidth; ``int4_to_bf16`` for prompt-sized inputs (torch's int4 kernel is slower than
  float32 there).
- ``float_linear``: float32 weights packed in panels of 32 columns (``float_linear.cpp``): MKL's GEMM on
  unpacked weights wastes a third of the time at the 2-64 rows of a decode step.
- ``decode_attention``: one query per sequence against its context read where it lies in the paged
  cache (``decode_attention.cpp``): no gathered copy of the context for SDPA.
- ``prefill_attention``: a prompt chunk's rows, causal, against their shared context in the paged cache
  (``prefill_attention.cpp``): up to 16 query vectors per register, each key and value widened once.
- ``keep_warm``: the OpenMP team's threads kept running (yielding) for a while, between steps
  (``keep_warm.cpp``): a core left idle takes milliseconds to wake on a VM.
- ``layer_glue``: an eager step's elementwise work between the matmuls, one pass each (residual add and
  RMSNorm, RoPE, SwiGLU's silu * up; ``layer_glue.cpp``).
- ``argmax_logsumexp``: each row's first maximum and log-sum-exp for the sampler of an eager step
  (``argmax_logsumexp.cpp``): torch's CPU argmax walks a row one element at a time.

The build takes ~15 s with the C++ compiler torch.compile needs anyway; its output lives under the cache
directory (``<cache>/kernels/``), so later starts only load it. Without a compiler, or on a CPU without
AVX2 (AVX-512 for ``float_linear``), the accessors return None and callers keep torch's kernels (logged
once). ``HOMEAI_NATIVE_KERNELS=0`` switches them off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_SOURCES = (_HERE / "int8_linear.cpp", _HERE / "int4_linear.cpp", _HERE / "float_linear.cpp",
            _HERE / "decode_attention.cpp", _HERE / "prefill_attention.cpp", _HERE / "layer_glue.cpp",
            _HERE / "keep_warm.cpp", _HERE / "argmax_logsumexp.cpp")
_HEADERS = (_HERE / "int8_linear_kernel.inc", _HERE / "attention_math.inc")
_DISABLE_ENV = "HOMEAI_NATIVE_KERNELS"  # "0": never build or use them (torch's kernels only)
_lock = threading.Lock()
_loaded: dict[str, bool] = {}  # "library": whether the build loaded (absent: not tried yet)


def build_dir() -> Path:
    """One folder per source version and torch version, under the cache directory."""
    from homeai.repository.cache import default_cache_dir

    text = b"".join(p.read_bytes() for p in _SOURCES + _HEADERS) + torch.__version__.encode()
    return default_cache_dir() / "kernels" / f"homeai_kernels-{hashlib.sha256(text).hexdigest()[:12]}"


def _build() -> None:
    from torch.utils.cpp_extension import load

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    load(name="homeai_kernels", sources=[str(s) for s in _SOURCES], build_directory=str(folder),
         extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"], extra_include_paths=[str(_HERE)],
         is_python_module=False, verbose=False)

    @torch.library.register_fake("homeai::int8_linear")
    def _int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], q.shape[0])

    @torch.library.register_fake("homeai::int8_linear_tiled")
    def _int8_tiled(x: torch.Tensor, qt: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], scale.shape[0])

    @torch.library.register_fake("homeai::int4_linear")
    def _int4(x: torch.Tensor, q: torch.Tensor, sz: torch.Tensor, int8_activations: bool) -> torch.Tensor:
        return x.new_empty(x.shape[0], q.shape[0] * 16)

    @torch.library.register_fake("homeai::float_linear")
    def _float(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("homeai::prefill_attention")
    def _prefill(q: torch.Tensor, kv: torch.Tensor, layer: int, slots: torch.Tensor, start: int,
                 bf16_dots: bool) -> torch.Tensor:
        return torch.empty_like(q)

    @torch.library.register_fake("homeai::argmax_logsumexp")
    def _argmax_lse(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return logits.new_empty(logits.shape[0], dtype=torch.long), logits.new_empty(logits.shape[0])

    @torch.library.register_fake("homeai::decode_attention")
    def _attention(q: torch.Tensor, kv: torch.Tensor, layer: int, slots: torch.Tensor,
                   lens: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(q)


def _library() -> bool:
    """Build or load the kernels once per process; False where they cannot be used here."""
    with _lock:
        if "library" not in _loaded:
            ok = False
            if os.environ.get(_DISABLE_ENV, "1") == "0":
                log.info("native kernels off (%s=0): linear layers use torch's kernels", _DISABLE_ENV)
            elif torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
                log.info("no AVX2 on this CPU: linear layers use torch's kernels")
            else:
                try:
                    _build()
                    ok = True
                except Exception as exc:  # noqa: BLE001 - no compiler, no headers: torch's kernels still work
                    log.warning("native kernels unavailable, linear layers use torch's kernels: %s", exc)
            _loaded["library"] = ok
        return _loaded["library"]


def int8_linear() -> Callable[..., torch.Tensor] | None:
    """``op(x [M, K] float32, q [N, K] int8, scale [N] float32) -> [M, N] float32`` (CPU tensors, K a
    multiple of 16), or None where it cannot be built or used here."""
    return torch.ops.homeai.int8_linear.default if _library() else None


def int8_to_bf16() -> Callable[..., None] | None:
    """``op(out [N, K] bfloat16, q [N, K] int8)`` writes q's values into ``out`` (exact), or None where it
    cannot be built or this CPU lacks AVX-512. See ``homeai.runtime.quant.Int8Linear``."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not _library():
        return None
    return torch.ops.homeai.int8_to_bf16.default


def int8_linear_tiled() -> Callable[..., torch.Tensor] | None:
    """``op(x [M, K] float32, qt [N/16, K/2, 32] int8, scale [N] float32) -> [M, N] float32`` (``quant.tile_int8``'s
    layout, K a multiple of 32), or None where it cannot be built or this CPU lacks AVX512-VNNI."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not cpu_has_vnni() or not _library():
        return None
    return torch.ops.homeai.int8_linear_tiled.default


def cpu_has_vnni() -> bool:
    """Whether this CPU multiplies int8/int16 with AVX512-VNNI (the int4 kernel's int8 activations, the tiled
    int8 head)."""
    return bool(getattr(torch.cpu, "_is_vnni_supported", lambda: False)())


def int4_linear() -> Callable[..., torch.Tensor] | None:
    """``op(x [M, K] float32, q [N/16, K/32, 256] uint8, sz [N/16, K/32, 32] float16, int8_activations) ->
    [M, N] float32``: Q4_1's groups of 32 in tiles of 16 rows (``int4_linear.cpp``, ``quant.tile_q4_1``;
    int8_activations: VNNI where the CPU has it), or None where it cannot be built or this CPU lacks
    AVX-512."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not _library():
        return None
    return torch.ops.homeai.int4_linear.default


def int4_to_bf16() -> Callable[..., None] | None:
    """``op(out [N, K] bfloat16, q, sz)`` writes the int4 weights as bfloat16 (for prompt-sized matmuls), or
    None where ``int4_linear`` is None."""
    if int4_linear() is None:
        return None
    return torch.ops.homeai.int4_to_bf16.default


def float_linear() -> Callable[..., torch.Tensor] | None:
    """``op(x [M, K] float32, packed [ceil(N/32), K, 32] float32, N) -> [M, N] float32`` (CPU tensors;
    ``pack_float_weight`` makes ``packed``), or None where it cannot be built or this CPU lacks AVX-512."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not _library():
        return None
    return torch.ops.homeai.float_linear.default


def decode_attention() -> Callable[..., torch.Tensor] | None:
    """``op(q [B, heads, d], kv [layers, slots, 2, kv_heads, d], layer, slots [B, L], lens [B]) -> [B, heads,
    d]`` (CPU tensors, q float32, the cache float32, float16 or bfloat16, d 64 or 128): one query per row
    against its context read from the paged cache, or None where it cannot be built or this CPU lacks
    AVX-512."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not _library():
        return None
    return torch.ops.homeai.decode_attention.default


def prefill_attention() -> Callable[..., torch.Tensor] | None:
    """``op(q [n, heads, d], kv [layers, slots, 2, kv_heads, d], layer, slots [start + n], start, bf16_dots)
    -> [n, heads, d]`` (the same tensors as ``decode_attention``): the chunk's row i, at position start + i,
    against positions 0 .. start + i (with ``bf16_dots``, in bfloat16 products where the CPU has
    AVX512-BF16), or None where it cannot be built or this CPU lacks AVX-512."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not _library():
        return None
    return torch.ops.homeai.prefill_attention.default


class LayerGlue(NamedTuple):
    """The fused elementwise ops of an eager step (``layer_glue.cpp``; float32 CPU tensors, rows contiguous).

    - ``add_rms_norm(x [T, H], delta [T, H] | None, w [H], eps) -> [T, H]``: x += delta in place, then
      RMSNorm(x) * w
    - ``silu_mul(gate_up [T, 2I]) -> [T, I]``: silu(gate) * up
    - ``rope_(x [T, C], positions [T], table [P, d/2, 2], heads)``: the first ``heads`` heads (interleaved
      pairs) of each row rotated in place by (cos, sin) at its position
    """

    add_rms_norm: Callable[..., torch.Tensor]
    silu_mul: Callable[..., torch.Tensor]
    rope_: Callable[..., None]


def layer_glue() -> LayerGlue | None:
    """The fused elementwise ops, or None where they cannot be built or this CPU lacks AVX-512."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not _library():
        return None
    ops = torch.ops.homeai
    return LayerGlue(ops.add_rms_norm.default, ops.silu_mul.default, ops.rope_.default)


def argmax_logsumexp() -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """``op(logits [N, V] float32 CPU) -> (tokens [N] long, lse [N] float32)``: each row's first maximum
    (as ``torch.argmax``) and ``torch.logsumexp``, or None where it cannot be built or this CPU lacks
    AVX-512."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512" or not _library():
        return None
    return torch.ops.homeai.argmax_logsumexp.default


def keep_warm() -> Callable[[int], None] | None:
    """``op(micros)``: every thread of the caller's OpenMP team runs (yielding) for ``micros``; None where
    the kernels are not loaded in this process. It never builds them: the device loop asks between steps,
    where a build (~15 s) would stall every request."""
    with _lock:
        loaded = _loaded.get("library", False)
    return torch.ops.homeai.keep_warm.default if loaded else None


PANEL = 32  # output columns per panel (float_linear.cpp's kPanel)


def pack_float_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N/32), K, 32]: panel p holds output columns 32p..32p+31, k-major (zeros pad N)."""
    n, k = weight.shape
    panels = -(-n // PANEL)
    padded = torch.nn.functional.pad(weight, (0, 0, 0, panels * PANEL - n))
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


def unpack_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` of the [N, K] weight that ``packed`` holds (a tied embedding's lookups): [len, K]."""
    return packed[rows // PANEL, :, rows % PANEL]
